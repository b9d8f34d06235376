"""Importing this starts a thread (for the fork server's test that refuses to fork then)."""

import threading
import time

threading.Thread(target=time.sleep, args=(60,), daemon=True, name="import-time-thread").start()
