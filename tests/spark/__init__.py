"""Tests of the PySpark data source ``lmq`` (lmq_client.spark)."""
