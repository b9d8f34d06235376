"""The partition rule once named ``dirichlet`` (quantity skew: a Dirichlet draw over data volumes)
is now ``quantity``, its concentration a parameter: ``partition_params = {"alpha": dirichlet_alpha}``.

The shards those experiments saved are kept as they are (windows of the seeded permutation):
only the rule's name and its parameters change, so the experiment still says how it was split.
"""

from django.db import migrations


def forwards(apps, schema_editor):
    Experiment = apps.get_model("experiments", "Experiment")
    for experiment in Experiment.objects.filter(partition_rule="dirichlet").only("id", "dirichlet_alpha"):
        params = {} if experiment.dirichlet_alpha is None else {"alpha": experiment.dirichlet_alpha}
        Experiment.objects.filter(id=experiment.id).update(partition_rule="quantity", partition_params=params)


def backwards(apps, schema_editor):
    Experiment = apps.get_model("experiments", "Experiment")
    Experiment.objects.filter(partition_rule="quantity").update(partition_rule="dirichlet", partition_params={})


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0009_task_metadata_and_label_partitions"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
