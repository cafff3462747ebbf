"""Give Airflow a PostgreSQL role that owns the metadata database and nothing more: no superuser, no
CREATEDB, no CREATEROLE, so task code that reads its connection string (any task under the
LocalExecutor) cannot `COPY ... TO PROGRAM` in the database container or reach other databases. Run
by airflow-init.sh, as PostgreSQL's superuser, before `airflow db migrate` (which then runs as the owner):

    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN   postgresql://<role>:<password>@host/<database>: what to create
    POSTGRES_SUPERUSER_PASSWORD           the `postgres` superuser's password (the postgres service's)

Idempotent: the role's password and attributes are (re)set from the URL, the database is created once
and owned by the role, CONNECT on it is revoked from PUBLIC. A database made earlier by a superuser
`airflow` (the postgres image's POSTGRES_USER before this script): the role loses SUPERUSER here.
"""
from __future__ import annotations

import os
import sys

import psycopg2
from psycopg2 import sql
from sqlalchemy.engine import make_url

SUPERUSER = "postgres"


def superuser_connection(dbname: str = "postgres"):
    metadata = make_url(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    conn = psycopg2.connect(host=metadata.host, port=metadata.port or 5432, user=SUPERUSER,
                            password=os.environ["POSTGRES_SUPERUSER_PASSWORD"], dbname=dbname)
    conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
    return conn


def main() -> int:
    metadata = make_url(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    if metadata.username == SUPERUSER:
        print(f"metadata-db: AIRFLOW__DATABASE__SQL_ALCHEMY_CONN must name Airflow's own role, not {SUPERUSER}",
              file=sys.stderr)
        return 1
    role, database = sql.Identifier(metadata.username), sql.Identifier(metadata.database)
    conn = superuser_connection()
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (metadata.username,))
        verb = "ALTER" if cur.fetchone() else "CREATE"
        cur.execute(sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
                            "PASSWORD %s").format(role), (metadata.password,))
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (metadata.database,))
        if not cur.fetchone():
            cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(database, role))
        cur.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(database, role))
        cur.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(database))
    conn.close()
    with superuser_connection(metadata.database) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(role))  # migrations create tables there
    print(f"metadata-db: role {metadata.username!r} owns database {metadata.database!r}, no superuser")
    return 0


if __name__ == "__main__":
    sys.exit(main())
