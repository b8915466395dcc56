"""The built-in RAVEN / I-RAVEN generator (file formats and sampling rules: ``data_README.md``)."""
