"""Readers for each supported dataset layout. Each returns parsed rows and rejected rows.

A reader never drops a line silently: a line it cannot parse becomes a `RejectedRow`
with its file, line number, reason and original content, which ingest quarantines.
Checks on rows that *do* parse (labels, duplicates, leakage) belong to the validate stage.

- `results`: what a reader returns, and the errors that stop a file;
- `decoding`: a file's bytes as text, and its lines;
- `tables`: the line formats (TREC, headerless pairs, CSV and JSONL through a column mapping);
- `catalogs`: catalogs of standard questions, derived texts, labels read as catalog ids;
- `datasets`: what ingest reads as params.yaml's data section names it.

Those that log (decoding, catalogs, datasets) log as "tqc.readers", the one logger `incoming` filters.
"""

from tqc.readers.catalogs import (label_in_words, labels_read_as_catalog, read_catalog_file, read_catalog_rows,
                                  shipped_catalog, with_added_classes, with_derived_classes)
from tqc.readers.datasets import (ADDED_CATALOG, ADDED_QUESTIONS, added_standard_questions, official_files,
                                  read_additions, read_custom_table, read_dataset, read_generated, read_validation,
                                  unusable_data_file)
from tqc.readers.decoding import decode_argument, decode_bytes, decode_file, split_lines
from tqc.readers.results import (DatasetSplits, MissingColumns, ReaderError, ReadResult, RejectedRow, RowsRejected,
                                 require_rows)
from tqc.readers.tables import (JSONL_SUFFIXES, TABLE_SUFFIXES, csv_record, is_jsonl, read_headerless_pairs, read_table,
                                read_texts, read_trec, read_unlabelled, row_as_csv)

__all__ = ["ADDED_CATALOG", "ADDED_QUESTIONS", "JSONL_SUFFIXES", "TABLE_SUFFIXES", "DatasetSplits", "MissingColumns",
           "ReadResult", "ReaderError", "RejectedRow", "RowsRejected", "added_standard_questions", "csv_record",
           "decode_argument", "decode_bytes", "decode_file", "is_jsonl", "label_in_words", "labels_read_as_catalog",
           "official_files", "read_additions", "read_catalog_file", "read_catalog_rows", "read_custom_table",
           "read_dataset", "read_generated", "read_headerless_pairs", "read_table", "read_texts", "read_trec",
           "read_unlabelled", "read_validation", "require_rows", "row_as_csv", "shipped_catalog", "split_lines",
           "unusable_data_file", "with_added_classes", "with_derived_classes"]
