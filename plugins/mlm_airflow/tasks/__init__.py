"""The TaskFlow tasks of the pipeline's steps and what each of them does first."""
