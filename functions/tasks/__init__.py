"""Lambda entry points for the workflow's steps and background tasks."""
