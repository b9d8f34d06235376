"""The moved models' content types follow them from ``experiments`` to ``lab``, so their admin
permissions (``view_usershare``, ``change_devicelease``, …) and the groups and users holding them
stay attached instead of being orphaned beside new ``lab.*`` ones. A fresh database has no rows
yet: Django creates them under ``lab`` after migrating.
"""

from django.db import migrations

MOVED = ("devicelease", "usershare")


def relabel(apps, schema_editor, *, source: str, target: str) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if not content_type.objects.filter(app_label=target, model=model).exists():
            content_type.objects.filter(app_label=source, model=model).update(app_label=target)


class Migration(migrations.Migration):
    dependencies = [
        ("lab", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(
            lambda apps, editor: relabel(apps, editor, source="experiments", target="lab"),
            lambda apps, editor: relabel(apps, editor, source="lab", target="experiments"),
        ),
    ]
