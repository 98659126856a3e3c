"""Build the packaged-format carbon tables of another year from Electricity Maps hourly files.

The generalisation test "other year" (``carbon-gym experiment generalise``) judges the learned
agent on carbon it never saw: the packaged 2022 tables
(``carbon_gym/data/carbon/electricitymaps_ci_{lca,direct}_hourly_2022.csv``) were written by::

    python eval/build_carbon_year.py --year 2022 --out carbon_gym/data/carbon

from local mirrors of the public repositories that hold Electricity Maps' per-zone hourly files
(``--mirror OWNER/NAME=GIT_DIR``, defaults: the mirrors of this machine). Per zone it reads one
file (:data:`SOURCES`: repository, path; ``{y}`` is the year), checks 8,760 (8,784) hourly rows of
that year without gaps or duplicates, and joins the zones on their UTC hour into one wide table
per kind (LCA, direct), values unchanged; ``provenance_<year>.csv`` records per zone the
repository, commit, path, blob sha, row count, means and the share of estimated hours.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Sequence

#: The packaged zones (the order of the 2023 tables).
ZONES = ("US-CAL-CISO", "US-TEX-ERCO", "US-MIDA-PJM", "US-NY-NYIS", "CA-ON", "DE", "GB", "FR", "ES", "NO", "JP-TK",
         "KR", "SG", "IN-WE", "AU-NSW", "AU-VIC", "BR-CS", "CL-SEN", "ZA", "BR")
_GREEN = "HewlettPackard/green-dcc"
_UMASS = "umassos/decarbonization-potential"
#: zone -> (repository, path of its hourly file; ``{y}`` = year). DE is the DE-LU bidding-zone
#: file, BR-CS the BR-SP file, CL-SEN the CL-SIC file (as for 2023).
SOURCES: dict[str, tuple[str, str]] = {
    **{z: (_GREEN, f"data/carbon_intensity/{z}/{{y}}/{z}_{{y}}_hourly.csv")
       for z in ("US-CAL-CISO", "US-TEX-ERCO", "US-MIDA-PJM", "US-NY-NYIS", "CA-ON", "GB", "JP-TK", "KR", "SG",
                 "IN-WE", "AU-NSW", "AU-VIC", "ZA")},
    "DE": (_GREEN, "data/carbon_intensity/DE-LU/{y}/DE-LU_{y}_hourly.csv"),
    "BR-CS": (_GREEN, "data/carbon_intensity/BR-SP/{y}/BR-SP_{y}_hourly.csv"),
    "CL-SEN": (_GREEN, "data/carbon_intensity/CL-SIC/{y}/CL-SIC_{y}_hourly.csv"),
    "ES": (_UMASS, "downloaded_carbon_data/ES_{y}_hourly.csv"),
    "NO": (_UMASS, "downloaded_carbon_data/NO_{y}_hourly.csv"),
    "BR": (_UMASS, "downloaded_carbon_data/BR_{y}_hourly.csv"),
    # re-saved by its repository (dates DD/MM/YYYY HH:MM, one extra CO2 column); values as Electricity Maps'
    "FR": ("Dominik1207/K_ISS", "FR_{y}_hourly.csv"),
}
DEFAULT_MIRRORS = {r: f"/work/.mirror/{r.replace('/', '+')}/repo" for r in (_GREEN, _UMASS, "Dominik1207/K_ISS")}


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def _parse_time(text: str) -> datetime:
    text = text.strip()
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%d/%m/%Y %H:%M"):
        try:
            return datetime.strptime(text, fmt)
        except ValueError:
            pass
    raise SystemExit(f"unrecognised timestamp {text!r}")


def _column(header: list[str], needle: str) -> int:
    for i, h in enumerate(header):
        if needle.lower() in h.lower():
            return i
    raise SystemExit(f"no column mentioning {needle!r} in {header}")


def read_zone(git_dir: str, path: str, year: int) -> tuple[dict[datetime, tuple[float, float]], float, str, str]:
    """``({hour: (lca, direct)}, share of estimated hours, commit, blob sha)`` of one file; exits
    on a gap, a duplicate or a missing value."""
    commit = _git(git_dir, "rev-parse", "HEAD").strip()
    blob = _git(git_dir, "rev-parse", f"HEAD:{path}").strip()
    rows = list(csv.reader(io.StringIO(_git(git_dir, "show", f"HEAD:{path}"))))
    head, body = rows[0], [r for r in rows[1:] if r]
    it, il, idr, ie = (_column(head, "datetime"), _column(head, "(lca)"), _column(head, "(direct)"),
                       _column(head, "estimated"))
    out: dict[datetime, tuple[float, float]] = {}
    est = 0
    for r in body:
        t = _parse_time(r[it])
        if t.year != year:
            continue
        if t in out:
            raise SystemExit(f"{path}: duplicate hour {t}")
        out[t] = (float(r[il]), float(r[idr]))
        est += r[ie].strip().lower() == "true"
    hours = [datetime(year, 1, 1) + timedelta(hours=h) for h in range((datetime(year + 1, 1, 1) - datetime(year, 1, 1)).days * 24)]
    missing = [h for h in hours if h not in out]
    if missing:
        raise SystemExit(f"{path}: {len(missing)} missing hours (first {missing[0]})")
    return out, est / len(out), commit, blob


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python eval/build_carbon_year.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--year", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mirror", action="append", default=[], metavar="OWNER/NAME=GIT_DIR")
    a = ap.parse_args(argv)
    mirrors = dict(DEFAULT_MIRRORS)
    mirrors.update(dict(m.split("=", 1) for m in a.mirror))
    data, prov = {}, []
    for z in ZONES:
        repo, path = SOURCES[z]
        path = path.format(y=a.year)
        vals, est, commit, blob = read_zone(mirrors[repo], path, a.year)
        data[z] = vals
        lca = [v[0] for v in vals.values()]
        prov.append([z, a.year, len(vals), f"{sum(lca) / len(lca):.1f}", f"{min(lca):.2f}", f"{max(lca):.2f}",
                     f"{sum(v[1] for v in vals.values()) / len(vals):.1f}", f"{est:.3f}", repo, commit, path, blob])
        print(f"{z}: {len(vals)} hours, LCA mean {float(prov[-1][3]):.0f} g/kWh, estimated {est:.1%} ({repo})")
    hours = sorted(data[ZONES[0]])
    a.out.mkdir(parents=True, exist_ok=True)
    for k, kind in enumerate(("lca", "direct")):
        with open(a.out / f"electricitymaps_ci_{kind}_hourly_{a.year}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["datetime_utc", *ZONES])
            for h in hours:
                w.writerow([h.strftime("%Y-%m-%d %H:%M:%S"), *(f"{data[z][h][k]:.2f}" for z in ZONES)])
    with open(a.out / f"provenance_{a.year}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["zone", "year", "rows", "ci_lca_mean", "ci_lca_min", "ci_lca_max", "ci_direct_mean", "frac_estimated",
                    "repo", "commit", "path", "blob_sha"])
        w.writerows(prov)
    print(f"wrote {a.out}/electricitymaps_ci_{{lca,direct}}_hourly_{a.year}.csv and provenance_{a.year}.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
