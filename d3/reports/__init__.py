"""What a study's results say: headlines, tables and markdown for sweeps (`sweep`), generation sweeps
(`generation`) and the drop-order study (`drop_order`). Pure: they read result files, never a model."""
