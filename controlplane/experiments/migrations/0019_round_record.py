"""Round record: stored per-round and per-device metrics (filled by helper H3)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("experiments", "0018_execution_options")]

    operations: list[migrations.operations.base.Operation] = []
