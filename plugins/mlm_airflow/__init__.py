"""The Airflow side of the pipeline, one module or package per Airflow role (docs/layout.md); all ML logic is
in mlm_tasks."""
