"""Accuracy of the fitted performance model on measured tables.

--rubick DIR: for each model of the Rubick artifact, fit on at most --fit-rows rows (default
8) chosen by `tidal.planner.selection` from that model's profile and placement rows, predict
the iteration time of every other measured row, print a per-model table and, last,
`perfmodel_mape: X` (mean over models of the mean absolute percentage error).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tidal.planner import traces
from tidal.planner.perfmodel import Hardware, fit
from tidal.planner.selection import family, select


def rubick(root: Path, fit_rows: int, verbose: bool) -> float:
    hw = Hardware()
    print(f"{'model':<9}{'fit':>4}{'pred':>6}{'fit err':>9}{'MAPE':>8}{'max APE':>9}  families")
    mapes = []
    for model in traces.MODELS:
        work = traces.workload(root, model)
        measured = traces.placements(root, model)
        pool = traces.profile_rows(root, model) + measured
        chosen = select(pool, lambda r: r.sample.point, fit_rows)
        chosen_keys = {(r.exec_plan, r.placement) for r in chosen}
        model_fit = fit([r.sample for r in chosen], work, hw)
        test = [r for r in measured if (r.exec_plan, r.placement) not in chosen_keys]
        apes = []
        for r in test:
            pred = model_fit.predict(work, r.sample.point, hw).iter
            apes.append(abs(pred - r.sample.iter_s) / r.sample.iter_s)
            if verbose:
                print(f"    {r.exec_plan:>13} {r.placement:>9}  measured {r.sample.iter_s:8.3f}  "
                      f"predicted {pred:8.3f}  {100 * apes[-1]:5.1f}%")
        mape = float(np.mean(apes))
        mapes.append(mape)
        fams = sorted({family(r.sample.point) for r in chosen})
        print(f"{model:<9}{len(chosen):>4}{len(test):>6}{100 * model_fit.mape:>8.1f}%{100 * mape:>7.1f}%"
              f"{100 * max(apes):>8.1f}%  {','.join(fams)}")
    return float(np.mean(mapes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rubick", type=Path, help="directory of the Rubick artifact tables")
    ap.add_argument("--fit-rows", type=int, default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.rubick:
        print(f"perfmodel_mape: {rubick(args.rubick, args.fit_rows or 8, args.verbose):.4f}")
    else:
        ap.error("give --rubick DIR")


if __name__ == "__main__":
    main()
