"""The bi-encoder: text encoders, pooling, similarity and (de)serialisation."""
