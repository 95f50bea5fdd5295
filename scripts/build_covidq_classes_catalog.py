"""Build the shipped COVID-Q classes catalog: one representative question per class.

The representative is the first training question (train3.csv) of each class, so the
catalog never copies a test question. Run once; the output is committed as
src/tqc/catalogs/covidq-classes.csv.

    python scripts/build_covidq_classes_catalog.py ../shared/datasets/covid-q
"""

import csv
import sys
from pathlib import Path


def main(covidq_dir: Path, out_path: Path) -> None:
    representative: dict[str, str] = {}
    with (covidq_dir / "classes" / "train3.csv").open(encoding="utf-8", newline="") as f:
        for question, class_id in csv.reader(f):
            representative.setdefault(class_id.strip(), question.strip())
    rows = sorted(representative.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else kv[0])
    with out_path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["class_id", "text"])
        writer.writerows(rows)
    print(f"wrote {len(rows)} classes to {out_path}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).resolve().parents[1] / "src/tqc/catalogs/covidq-classes.csv")
