"""Build the shipped COVID-Q classes catalog: one representative question per class.

The representative is the first training question (train3.csv) of each class that no test file
(testA.csv, testB.csv) holds, compared as validate compares texts: train3 and testA share questions
word for word, and a standard question equal to a test question judges nothing (the zero-shot encoder
scores it 1.0). Run once; the output is committed as src/tqc/catalogs/covidq-classes.csv.

    python scripts/build_covidq_classes_catalog.py ../shared/datasets/covid-q
"""

import csv
import sys
from pathlib import Path


def main(covidq_dir: Path, out_path: Path) -> None:
    from tqc.text import compared_text

    tested = {compared_text(question) for name in ("testA.csv", "testB.csv")
              for question, _ in _rows(covidq_dir / "classes" / name)}
    representative: dict[str, str] = {}
    for question, class_id in _rows(covidq_dir / "classes" / "train3.csv"):
        if compared_text(question) not in tested:
            representative.setdefault(class_id.strip(), question.strip())
    rows = sorted(representative.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else kv[0])
    with out_path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["class_id", "text"])
        writer.writerows(rows)
    print(f"wrote {len(rows)} classes to {out_path}")


def _rows(path: Path) -> list[tuple[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return [(question, class_id) for question, class_id in csv.reader(f)]


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).resolve().parents[1] / "src/tqc/catalogs/covidq-classes.csv")
