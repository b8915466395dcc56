"""The built-in RAVEN / I-RAVEN generator (see ``../shared/docs/raven-pgm-data-spec.md``-derived docs in README)."""
