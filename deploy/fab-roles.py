"""The FAB role for people who train models but do not release them, made by airflow-init.sh:

    Trainer   Viewer + trigger mlm_pretrain runs; it may not mark, clear or delete task instances,
              answer approve_release (HITL), create Asset events, edit or delete runs, nor trigger
              or edit the other DAGs (the refresh, the janitor).

FAB's auth manager lets a trigger (POST dagRuns) through only with can_create on DAG Runs *and* can_edit
on the DAG: the edit is granted on DAG:mlm_pretrain alone, which also lets a Trainer pause that one DAG
(Airflow has no permission between the two).

FAB's stock User role may do all of those: with it, whoever triggers a run could approve its release,
mark approve_release done, or send the shards event a scheduled run trains on (docs/security.md, "Users and
roles"). Idempotent: the role's permissions are set anew on every run (a permission removed here is
removed from the role).

    python deploy/fab-roles.py
"""
from __future__ import annotations

from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder
from airflow.utils.providers_configuration_loader import providers_configuration_loaded

ROLE = "Trainer"
ADDED = [("can_create", "DAG Runs"), ("can_edit", "DAG:mlm_pretrain")]


@providers_configuration_loaded
def main() -> None:
    from airflow.providers.fab.auth_manager.security_manager.override import FabAirflowSecurityManagerOverride

    with get_application_builder() as appbuilder:
        sm = appbuilder.sm
        role = sm.find_role(ROLE) or sm.add_role(ROLE)
        wanted = [*FabAirflowSecurityManagerOverride.VIEWER_PERMISSIONS, *ADDED]
        perms = []
        for action, resource in wanted:
            perm = sm.get_permission(action, resource) or sm.create_permission(action, resource)
            if perm is not None:
                perms.append(perm)
        role.permissions = perms
        sm.session.merge(role)
        sm.session.commit()
        print(f"fab-roles: role {ROLE!r} has {len(perms)} permissions (Viewer's, and triggering mlm_pretrain)")


if __name__ == "__main__":
    main()
