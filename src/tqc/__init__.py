"""tqc: text2text question classification with the two-stage ADMC bi-encoder."""

__version__ = "0.1.0"
