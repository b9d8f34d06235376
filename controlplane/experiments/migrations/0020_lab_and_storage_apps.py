"""Device leases and users' fair-share weights move to the ``lab`` app.

State only: the tables keep their names (``experiments_devicelease``, ``experiments_usershare``,
the models' ``db_table``), so nothing is written to the database; ``lab`` 0001 takes them into
its state.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("experiments", "0019_round_record")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="DeviceLease"),
                migrations.DeleteModel(name="UserShare"),
            ],
            database_operations=[],
        )
    ]
