"""Give the Celery result backend its own PostgreSQL database and role, so that a Celery worker (which
runs task code) holds no credential of the metadata database. Run by airflow-init.sh with:

    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN   the metadata DB (its host, and its name to close it to the role)
    POSTGRES_SUPERUSER_PASSWORD           the `postgres` superuser's, who creates the role and database
    AIRFLOW__CELERY__RESULT_BACKEND       db+postgresql://<role>:<password>@host/<database>: what to create

Idempotent: the role's password is (re)set from the URL, the database is created once, and
CONNECT on both databases is revoked from PUBLIC (the result role cannot even open the metadata DB).
"""
from __future__ import annotations

import os
import sys

import psycopg2
from psycopg2 import sql
from sqlalchemy.engine import make_url


def main() -> int:
    metadata = make_url(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    results = make_url(os.environ["AIRFLOW__CELERY__RESULT_BACKEND"].removeprefix("db+"))
    if results.username == metadata.username or results.database == metadata.database:
        print(f"result-backend-db: AIRFLOW__CELERY__RESULT_BACKEND must name its own role and database, "
              f"not the metadata DB's ({metadata.username}@{metadata.database})", file=sys.stderr)
        return 1
    conn = psycopg2.connect(host=metadata.host, port=metadata.port or 5432, user="postgres",
                            password=os.environ["POSTGRES_SUPERUSER_PASSWORD"], dbname="postgres")
    conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
    role, database = sql.Identifier(results.username), sql.Identifier(results.database)
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (results.username,))
        verb = "ALTER" if cur.fetchone() else "CREATE"
        cur.execute(sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD %s").format(role),
                    (results.password,))
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (results.database,))
        if not cur.fetchone():
            cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(database, role))
        for name in (database, sql.Identifier(metadata.database)):
            cur.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(name))
    conn.close()
    print(f"result-backend-db: role {results.username!r} owns database {results.database!r}; "
          f"no access to {metadata.database!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
