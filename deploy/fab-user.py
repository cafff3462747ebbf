"""Create or update users of the FAB auth manager: `airflow-init.sh` makes `admin`, and
tests/peers/airflow_stack.py the users of the other roles. Each password comes from the environment
variable MLM_USER_PASSWORD_<USERNAME> (upper case), never from the command line, where `ps` and the
shell history would show it (`airflow users create --password` puts it there).

    MLM_USER_PASSWORD_ADMIN=... python deploy/fab-user.py admin=Admin [viewer=Viewer ...]

An existing user gets the given role (only that one) and the password again, so a rerun applies a
changed AIRFLOW_ADMIN_PASSWORD. Roles: Admin, Op, User, Viewer, Public, and Trainer (deploy/fab-roles.py;
docs/security.md, "Users and roles").
"""
from __future__ import annotations

import os
import sys

from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder
from airflow.utils.providers_configuration_loader import providers_configuration_loaded


def parse(args: list[str]) -> list[tuple[str, str, str]]:
    users = []
    for arg in args:
        username, _, role = arg.partition("=")
        variable = f"MLM_USER_PASSWORD_{username.upper()}"
        if not username or not role:
            raise SystemExit(f"fab-user: expected USERNAME=ROLE, got {arg!r}")
        if not os.environ.get(variable):
            raise SystemExit(f"fab-user: set {variable} to the password of {username!r}")
        users.append((username, role, os.environ[variable]))
    return users


@providers_configuration_loaded
def main(args: list[str]) -> None:
    users = parse(args)
    with get_application_builder() as appbuilder:
        sm = appbuilder.sm
        for username, role_name, password in users:
            role = sm.find_role(role_name)
            if role is None:
                names = sorted(r.name for r in sm.get_all_roles())
                raise SystemExit(f"fab-user: {role_name!r} is not a role; the roles are {names}")
            user = sm.find_user(username=username)
            if user is None:
                if not sm.add_user(username, username, "-", f"{username}@localhost", role, password):
                    raise SystemExit(f"fab-user: could not create {username!r} (see the log above)")
                print(f"fab-user: created {username!r} with role {role_name}")
            else:
                user.roles = [role]
                sm.update_user(user)
                sm.reset_password(user.id, password)
                print(f"fab-user: updated {username!r}: role {role_name}, password reset")


if __name__ == "__main__":
    main(sys.argv[1:])
