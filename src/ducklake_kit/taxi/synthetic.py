"""Offline generator of TLC-shaped yellow-taxi months and of a TLC-shaped zone lookup.

The files have the exact Arrow schema of the real files of the chosen era (`schema.TLC_ERAS`), realistic
shapes (hour-of-day and weekday demand, lognormal distances, durations from hour-dependent speeds, fares
from the TLC tariff of the year, tips by payment type, airport trips and fees, all 265 zones) and the
real quirks at configurable rates (`QuirkRates`).

Determinism and memory: rows are generated in fixed blocks of `BLOCK_ROWS`, each from its own random
stream keyed by (seed, year, month, block index). The values therefore depend only on the seed, the month
and the row's position: the same seed, month and rows give the same values whatever the row-group size,
and a smaller month is a prefix of a larger one. Only one block and one row group are in memory at a time,
so tens of millions of rows take the same memory as a few hundred thousand.

Nothing here is copied from the real TLC files: zone names are generic ("Queens zone 12") except the
three airports, boroughs are assigned deterministically with the real per-borough counts.
"""

from __future__ import annotations

import calendar
import csv
import hashlib
import math
import os
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ducklake_kit.errors import KitError
from ducklake_kit.taxi.schema import TLC_ERAS, era_for

BLOCK_ROWS = 16_384  # rows per random stream; changing it changes the generated values
DEFAULT_CHUNK_ROWS = 262_144  # rows per Parquet row group (a bounded-memory unit, not a data parameter)

# --- Zones --------------------------------------------------------------------------------------------

ZONE_COUNT = 265
EWR, JFK, LGA = 1, 132, 138
UNKNOWN_ZONE, OUTSIDE_NYC = 264, 265
AIRPORTS = (EWR, JFK, LGA)

# Busy Manhattan pickup zones, busiest first (their ids follow public TLC trip statistics); they anchor
# the demand curve. The rest of Manhattan, and every other borough, is assigned below.
_HOT_MANHATTAN = (
    237, 161, 236, 162, 230, 186, 142, 170, 163, 239, 234, 48, 68, 79, 141, 107, 263, 140, 238, 249,
    100, 164, 229, 113, 137, 246, 90, 43, 233, 50, 231, 144, 148, 158, 211, 114, 125, 87, 13, 261,
)  # fmt: skip
# Congestion Relief Zone (Manhattan south of 60th St) among them: the 2025 `cbd_congestion_fee`.
_CBD = frozenset(
    (161, 162, 230, 186, 170, 163, 234, 48, 68, 79, 107, 249, 100, 164, 113, 137, 90, 233, 231, 144,
     148, 158, 211, 114, 125, 87, 13, 261, 246, 50, 229)
)  # fmt: skip
_BOROUGH_COUNTS = (("Manhattan", 69), ("Queens", 69), ("Brooklyn", 61), ("Bronx", 43), ("Staten Island", 20))
_YELLOW_ZONE_COUNT = 55  # Manhattan zones inside the yellow-cab exclusionary zone; the rest are "Boro Zone"


@dataclass(frozen=True)
class Zone:
    location_id: int
    borough: str
    zone: str
    service_zone: str


def zones() -> tuple[Zone, ...]:
    """The 265 synthetic zones, in LocationID order (deterministic; no randomness from the caller)."""
    fixed = {
        EWR: Zone(EWR, "EWR", "Newark Airport", "EWR"),
        JFK: Zone(JFK, "Queens", "JFK Airport", "Airports"),
        LGA: Zone(LGA, "Queens", "LaGuardia Airport", "Airports"),
        UNKNOWN_ZONE: Zone(UNKNOWN_ZONE, "Unknown", "N/A", "N/A"),
        OUTSIDE_NYC: Zone(OUTSIDE_NYC, "N/A", "Outside of NYC", "N/A"),
    }
    manhattan = list(_HOT_MANHATTAN)
    rest = [i for i in range(1, UNKNOWN_ZONE) if i not in fixed and i not in manhattan]
    random.Random(265).shuffle(rest)  # a fixed shuffle: same boroughs on every machine
    need = dict(_BOROUGH_COUNTS)
    need["Queens"] -= 2  # JFK and LaGuardia are Queens zones
    take = need["Manhattan"] - len(manhattan)
    manhattan += rest[:take]
    rest = rest[take:]
    borough_of = dict.fromkeys(manhattan, "Manhattan")
    for borough, _ in _BOROUGH_COUNTS[1:]:
        for i in rest[: need[borough]]:
            borough_of[i] = borough
        rest = rest[need[borough] :]
    assert not rest, "borough counts must add up to 263 zones"
    yellow = set(manhattan[:_YELLOW_ZONE_COUNT])
    out: list[Zone] = []
    counters: dict[str, int] = {}
    for i in range(1, ZONE_COUNT + 1):
        if i in fixed:
            out.append(fixed[i])
            continue
        b = borough_of[i]
        counters[b] = counters.get(b, 0) + 1
        out.append(Zone(i, b, f"{b} zone {counters[b]}", "Yellow Zone" if i in yellow else "Boro Zone"))
    return tuple(out)


def write_zone_lookup(path: str | os.PathLike) -> Path:
    """Write the synthetic zone lookup in the official CSV shape.

    Same header (`LocationID,Borough,Zone,service_zone`), quoting (strings quoted, ids bare) and CRLF
    line ends as https://d37ci6vzurychx.cloudfront.net/misc/taxi_zone_lookup.csv.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "taxi_zone_lookup.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\r\n")
        w.writerow(["LocationID", "Borough", "Zone", "service_zone"])
        for z in zones():
            w.writerow([z.location_id, z.borough, z.zone, z.service_zone])
    os.replace(tmp, path)  # atomic: a reader never sees half a file
    return path


# --- Months -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuirkRates:
    """Share of rows carrying each real quirk. The quirks below `null_block` are mutually exclusive.

    `null_block` None means the era's usual share (2025: 22%, 2024: 10%, 2022: 4%): rows where
    passenger_count, RatecodeID, store_and_fwd_flag, congestion_surcharge and Airport_fee are null and
    payment_type is 0 (Flex Fare). Those are valid trips, not errors.
    """

    null_block: float | None = None
    negative_fare: float = 0.012  # refunds: every amount negated, payment_type mostly 3/4
    zero_distance: float = 0.015
    dropoff_before_pickup: float = 0.0008
    out_of_month: float = 0.0005  # 80% just across the month edge, 20% in 2002/2008/2009
    ratecode_99: float = 0.004
    long_duration: float = 0.001  # 3 to 30 hours: some beyond a day
    distance_outlier: float = 0.0002  # odometer glitches: 500 to 200,000 miles

    def exclusive(self) -> tuple[tuple[str, float], ...]:
        return tuple((f, getattr(self, f)) for f in _EXCLUSIVE_QUIRKS)


_EXCLUSIVE_QUIRKS = (
    "negative_fare",
    "zero_distance",
    "dropoff_before_pickup",
    "out_of_month",
    "ratecode_99",
    "long_duration",
    "distance_outlier",
)
NULL_BLOCK_BY_ERA = {"2025": 0.22, "2024": 0.10, "2022": 0.04}


@dataclass(frozen=True)
class GeneratedFile:
    path: Path
    year: int
    month: int
    era: str
    rows: int
    seed: int
    row_groups: int
    bytes: int
    sha256: str  # of the file's bytes: the raw-bucket content key


def month_file_name(year: int, month: int) -> str:
    """The TLC file name of a month: yellow_tripdata_YYYY-MM.parquet."""
    return f"yellow_tripdata_{year:04d}-{month:02d}.parquet"


# Demand: share of pickups by hour (weekdays vs weekends) and relative demand by weekday (Mon..Sun).
_HOURS_WEEKDAY = (
    2.2, 1.3, 0.8, 0.5, 0.4, 0.5, 1.5, 3.0, 4.0, 4.2, 4.3, 4.6,
    5.0, 5.2, 5.6, 5.9, 6.0, 6.7, 7.0, 6.2, 5.5, 5.4, 4.8, 3.5,
)  # fmt: skip
_HOURS_WEEKEND = (
    4.0, 3.2, 2.4, 1.6, 0.9, 0.6, 0.7, 1.2, 2.0, 3.0, 4.0, 4.8,
    5.3, 5.5, 5.6, 5.6, 5.5, 5.6, 5.8, 5.4, 4.9, 4.8, 4.9, 4.7,
)  # fmt: skip
_WEEKDAY_DEMAND = (0.88, 0.97, 1.03, 1.08, 1.07, 1.02, 0.86)
# Typical Manhattan speed by hour, mph: slow in the day, fast at night.
_SPEED_BY_HOUR = (
    17, 18, 19, 19, 19, 18, 15, 11, 10, 10, 10, 9.5,
    9.5, 9.5, 9.5, 9.5, 9.5, 9.5, 10, 11, 12.5, 13.5, 14, 15.5,
)  # fmt: skip


@dataclass(frozen=True)
class _Tariff:
    initial: float
    per_mile: float
    per_slow_minute: float
    jfk_flat: float
    newark_surcharge: float
    rush: float
    overnight: float
    improvement: float
    airport_fee: float | None  # None: the column exists but the fee did not yet (before 2021)
    congestion: float
    toll: float


def _tariff(year: int, month: int) -> _Tariff:
    new = (year, month) >= (2022, 12)  # the fare increase of 2022-12-19
    return _Tariff(
        initial=3.00 if new else 2.50,
        per_mile=3.50 if new else 2.50,
        per_slow_minute=0.70 if new else 0.50,
        jfk_flat=70.00 if new else 52.00,
        newark_surcharge=20.00 if new else 17.50,
        rush=2.50 if new else 1.00,
        overnight=1.00 if new else 0.50,
        improvement=1.00 if new else 0.30,
        airport_fee=(1.75 if new else 1.25) if year >= 2021 else None,
        congestion=2.50 if (year, month) >= (2019, 2) else 0.0,
        toll=6.94 if year >= 2023 else 6.55,
    )


# pyarrow.compute is the vector engine (the project has no numpy); short names keep the formulas readable.
_add, _sub, _mul, _div = pc.add, pc.subtract, pc.multiply, pc.divide
_where, _and, _or, _not = pc.if_else, pc.and_, pc.or_, pc.invert
_F64 = pa.float64()


class _Categorical:
    """Draws from a discrete distribution by inverse-CDF lookup in a table of `slots` entries.

    Slots are shared out by largest remainder, so every probability is kept to within 1/slots.
    The table is the generator's only fixed memory: 4 MiB at 2**20 slots.
    """

    def __init__(self, values: list[int], probs: list[float], slots: int = 1 << 16):
        self.slots = slots
        total = sum(probs)
        exact = [p / total * slots for p in probs]
        counts = [int(e) for e in exact]
        by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - counts[i], reverse=True)
        for i in by_remainder[: slots - sum(counts)]:
            counts[i] += 1
        table: list[int] = []
        for v, c in zip(values, counts, strict=False):
            table.extend([v] * c)
        self.table = pa.array(table, type=pa.int32())

    def draw(self, u: pa.Array) -> pa.Array:
        slot = pc.cast(pc.floor(_mul(u, float(self.slots))), pa.int64())
        return pc.cast(pc.take(self.table, slot), pa.int64())


class _Stream:
    """Independent uniform streams of one block, one per named variable (pyarrow's seeded generator)."""

    def __init__(self, *key: int):
        self.key = key

    def uniform(self, name: str, n: int) -> pa.Array:
        h = hashlib.blake2b(repr((self.key, name)).encode(), digest_size=8).digest()
        return pc.random(n, initializer=int.from_bytes(h, "big") >> 1)

    def normal(self, name: str, n: int) -> pa.Array:
        # Box-Muller; 1 - u is in (0, 1], so the logarithm is finite.
        u1 = _sub(1.0, self.uniform(name + ".1", n))
        u2 = self.uniform(name + ".2", n)
        return _mul(pc.sqrt(_mul(-2.0, pc.ln(u1))), pc.cos(_mul(2 * math.pi, u2)))

    def lognormal(self, name: str, n: int, median, sigma: float) -> pa.Array:
        return _mul(median, pc.exp(_mul(sigma, self.normal(name, n))))

    def integers(self, name: str, n: int, low: int, high: int) -> pa.Array:
        """Uniform integers in [low, high)."""
        return pc.cast(pc.floor(_add(float(low), _mul(self.uniform(name, n), float(high - low)))), pa.int64())

    def below(self, name: str, n: int, p: float) -> pa.Array:
        return pc.less(self.uniform(name, n), p)


class _MonthModel:
    """Everything about a month that does not change from block to block."""

    def __init__(self, year: int, month: int, era: str, seed: int, rates: QuirkRates):
        self.year, self.month, self.era, self.seed = year, month, era, seed
        self.schema = TLC_ERAS[era]
        self.rates = rates
        self.null_block = NULL_BLOCK_BY_ERA[era] if rates.null_block is None else rates.null_block
        self.tariff = _tariff(year, month)
        days = calendar.monthrange(year, month)[1]
        self.start_s = _epoch_s(datetime(year, month, 1))
        self.end_s = _epoch_s(datetime(year + month // 12, month % 12 + 1, 1))
        first = datetime(year, month, 1).weekday()
        cells, hours, weekdays = [], [], []
        for d in range(days):
            wd = (first + d) % 7
            curve = _HOURS_WEEKEND if wd >= 5 else _HOURS_WEEKDAY
            for h in range(24):
                cells.append(_WEEKDAY_DEMAND[wd] * curve[h] / sum(curve))
                hours.append(h)
                weekdays.append(wd)
        self.cell = _Categorical(list(range(len(cells))), cells, slots=1 << 20)  # one cell = one hour of one day
        self.cell_hour = pa.array(hours, type=pa.int64())
        self.cell_weekday = pa.array(weekdays, type=pa.int64())
        self.speed_by_hour = pa.array(_SPEED_BY_HOUR, type=_F64)
        zs = zones()
        ids = [z.location_id for z in zs]
        self.yellow_zone = pa.array([z.service_zone == "Yellow Zone" for z in zs])
        self.cbd_zone = pa.array([i in _CBD for i in ids])
        self.pickup_zone = _Categorical(
            ids, _zone_weights(hot_share=0.78, airports={JFK: 0.045, LGA: 0.03, EWR: 0.0003}), 1 << 20
        )
        self.dropoff_zone = _Categorical(
            ids, _zone_weights(hot_share=0.62, airports={JFK: 0.018, LGA: 0.022, EWR: 0.003}), 1 << 20
        )
        self.cbd_from_s = _epoch_s(datetime(2025, 1, 5)) if era == "2025" else None
        vendors = {"2025": {1: 0.20, 2: 0.74, 7: 0.06}, "2024": {1: 0.25, 2: 0.745, 6: 0.005}}.get(
            era, {1: 0.28, 2: 0.72}
        )
        self.vendor = _Categorical(list(vendors), list(vendors.values()))
        self.payment = _Categorical([1, 2, 3, 4], [0.80, 0.17, 0.01, 0.02])
        self.refund_payment = _Categorical([3, 4, 2], [0.45, 0.45, 0.10])
        self.passengers = _Categorical(list(range(7)), [0.02, 0.74, 0.15, 0.035, 0.02, 0.02, 0.015])
        far_years = (2002, 2008, 2009)  # bogus years seen in real files
        self.far_month_start = pa.array([_epoch_s(datetime(y, month, 1)) for y in far_years], type=pa.int64())
        self.far_year = _Categorical([0, 1, 2], [1, 1, 1])

    def block(self, index: int) -> pa.Table:
        """The BLOCK_ROWS rows of block `index`: a function of (seed, year, month, index) only."""
        r = _Stream(self.seed, self.year, self.month, index)
        n = BLOCK_ROWS
        t = self.tariff
        flex = r.below("flex", n, self.null_block)  # the Flex Fare null block
        quirk = self._quirks(r.uniform("quirk", n))
        vendor = self.vendor.draw(r.uniform("vendor", n))

        cell = self.cell.draw(r.uniform("cell", n))
        hour = pc.take(self.cell_hour, cell)
        weekday = pc.take(self.cell_weekday, cell)
        pickup = _add(_add(self.start_s, _mul(cell, 3600)), r.integers("second", n, 0, 3600))

        pu = self.pickup_zone.draw(r.uniform("pu", n))
        do = self.dropoff_zone.draw(r.uniform("do", n))
        jfk = _or(pc.equal(pu, JFK), pc.equal(do, JFK))
        newark = _or(pc.equal(pu, EWR), pc.equal(do, EWR))
        airport = _or(_or(jfk, newark), _or(pc.equal(pu, LGA), pc.equal(do, LGA)))

        # Distance: lognormal around 1.7 mi in the city; airport runs around their usual distances.
        city = r.lognormal("distance", n, 1.7, 0.75)
        airport_median = _where(jfk, 17.0, _where(newark, 17.5, 9.5))
        dist = _where(airport, r.lognormal("airport_distance", n, airport_median, 0.25), city)
        dist = pc.round(pc.min_element_wise(pc.max_element_wise(dist, 0.1), 80.0), 2)
        dist = _where(quirk["zero_distance"], 0.0, dist)
        outlier = quirk["distance_outlier"]
        glitch = pc.round(_add(500.0, _mul(r.uniform("glitch", n), 199_500.0)), 2)
        dist = _where(outlier, glitch, dist)

        # Duration from an hour-dependent speed (faster on highways to the airports), plus stop time.
        speed = _mul(
            _mul(pc.take(self.speed_by_hour, hour), r.lognormal("speed", n, 1.0, 0.25)), _where(airport, 1.6, 1.0)
        )
        driven = _where(outlier, _add(2.0, _mul(r.uniform("glitch_miles", n), 38.0)), dist)
        travel = _div(_mul(driven, 3600.0), speed)
        duration = pc.cast(pc.round(_add(travel, pc.cast(r.integers("stops", n, 45, 240), _F64))), pa.int64())
        duration = _where(quirk["long_duration"], r.integers("long", n, 3 * 3600, 30 * 3600), duration)

        rc_u = r.uniform("ratecode", n)
        ratecode = _where(_and(jfk, r.below("jfk_flat", n, 0.8)), 2.0, 1.0)
        ratecode = _where(newark, 3.0, ratecode)
        standard = pc.equal(ratecode, 1.0)
        ratecode = _where(_and(standard, pc.less(rc_u, 0.002)), 4.0, ratecode)
        ratecode = _where(_and(standard, _and(pc.greater_equal(rc_u, 0.002), pc.less(rc_u, 0.006))), 5.0, ratecode)
        ratecode = _where(_and(standard, _and(pc.greater_equal(rc_u, 0.006), pc.less(rc_u, 0.0062))), 6.0, ratecode)

        # Fare: the meter (initial + per mile + slow-traffic minutes), or a flat or negotiated amount.
        minutes = _div(pc.cast(duration, _F64), 60.0)
        # `driven`, not `dist`: an odometer glitch does not reach the meter.
        slow = pc.min_element_wise(pc.max_element_wise(_mul(_sub(minutes, _mul(driven, 5.0)), 0.5), 0.0), 120.0)
        meter = _add(_add(t.initial, _mul(t.per_mile, driven)), _mul(t.per_slow_minute, slow))
        fare = _where(pc.equal(ratecode, 2.0), t.jfk_flat, meter)
        fare = _where(pc.equal(ratecode, 3.0), _add(meter, t.newark_surcharge), fare)
        fare = _where(pc.equal(ratecode, 4.0), _mul(meter, 1.6), fare)
        fare = _where(pc.equal(ratecode, 5.0), pc.cast(r.integers("negotiated", n, 20, 150), _F64), fare)
        fare = pc.round(fare, 1)
        ratecode = _where(quirk["ratecode_99"], 99.0, ratecode)

        rush = _and(pc.less(weekday, 5), _and(pc.greater_equal(hour, 16), pc.less(hour, 20)))
        overnight = _or(pc.greater_equal(hour, 20), pc.less(hour, 6))
        extra = _add(_where(rush, t.rush, 0.0), _where(_and(overnight, pc.not_equal(ratecode, 2.0)), t.overnight, 0.0))
        mta_tax = _where(_and(pc.equal(ratecode, 5.0), r.below("mta", n, 0.5)), 0.0, 0.5)
        improvement = pa.repeat(pa.scalar(t.improvement), n)
        zone_ix_pu, zone_ix_do = _sub(pu, 1), _sub(do, 1)
        yellow = _or(pc.take(self.yellow_zone, zone_ix_pu), pc.take(self.yellow_zone, zone_ix_do))
        congestion = _where(yellow, t.congestion, 0.0)
        airport_fee = _where(_or(pc.equal(pu, JFK), pc.equal(pu, LGA)), t.airport_fee or 0.0, 0.0)
        cbd = pa.repeat(pa.scalar(0.0), n)
        if self.cbd_from_s is not None:
            in_cbd = _or(pc.take(self.cbd_zone, zone_ix_pu), pc.take(self.cbd_zone, zone_ix_do))
            cbd = _where(_and(in_cbd, pc.greater_equal(pickup, self.cbd_from_s)), 0.75, 0.0)
        tolls = _where(_and(_or(airport, pc.greater(dist, 12.0)), r.below("toll", n, 0.3)), t.toll, 0.0)

        payment = _where(flex, 0, self.payment.draw(r.uniform("payment", n)))
        # Tips: recorded for card and app (Flex Fare) payments; cash tips never reach the record.
        tipped = _or(pc.equal(payment, 1), pc.equal(payment, 0))
        share = pc.min_element_wise(pc.max_element_wise(_add(0.21, _mul(0.05, r.normal("tip", n))), 0.05), 0.4)
        share = _where(r.below("no_tip", n, 0.12), 0.0, share)
        tip = _where(tipped, pc.round(_mul(_add(fare, extra), share), 2), 0.0)

        # Refunds: every amount negated, a card refund or dispute code (Flex Fare rows keep payment 0).
        negative = quirk["negative_fare"]
        tip = _where(negative, 0.0, tip)
        payment = _where(_and(negative, _not(flex)), self.refund_payment.draw(r.uniform("refund", n)), payment)
        sign = _where(negative, -1.0, 1.0)
        fare, extra, mta_tax, improvement, congestion, airport_fee, cbd, tolls = (
            _mul(a, sign) for a in (fare, extra, mta_tax, improvement, congestion, airport_fee, cbd, tolls)
        )
        # The null block does not report congestion or airport fees, so its total leaves them out.
        reported_fees = _where(flex, 0.0, _add(congestion, airport_fee))
        total = fare
        for part in (extra, mta_tax, tip, tolls, improvement, cbd, reported_fees):
            total = _add(total, part)
        total = pc.round(total, 2)

        dropoff = _add(pickup, duration)
        early = quirk["dropoff_before_pickup"]
        dropoff = _where(early, _sub(pickup, r.integers("early", n, 60, 3600)), dropoff)
        # Out-of-month pickups: 80% just across the month's edges, 20% at the same offset in a bogus year.
        away = quirk["out_of_month"]
        before = r.below("before", n, 0.5)
        near = _where(
            before,
            _sub(self.start_s, r.integers("before_s", n, 1, 6 * 3600)),
            _add(self.end_s, r.integers("after_s", n, 0, 6 * 3600)),
        )
        far = _add(
            pc.take(self.far_month_start, self.far_year.draw(r.uniform("far_year", n))), _sub(pickup, self.start_s)
        )
        moved = _where(r.below("near", n, 0.8), near, far)
        dropoff = _where(away, _add(moved, _sub(dropoff, pickup)), dropoff)
        pickup = _where(away, moved, pickup)

        passengers = pc.cast(self.passengers.draw(r.uniform("passengers", n)), _F64)
        store_fwd = _where(r.below("store_fwd", n, 0.004), "Y", "N")

        def nulls_in_block(a: pa.Array) -> pa.Array:
            return _where(flex, pa.scalar(None, a.type), a)

        id_type = self.schema.field("VendorID").type
        fee = airport_fee if t.airport_fee is not None else pa.nulls(n, _F64)
        cols = {
            "VendorID": pc.cast(vendor, id_type),
            "tpep_pickup_datetime": pc.cast(_mul(pickup, 1_000_000), pa.timestamp("us")),
            "tpep_dropoff_datetime": pc.cast(_mul(dropoff, 1_000_000), pa.timestamp("us")),
            "passenger_count": nulls_in_block(passengers),
            "trip_distance": dist,
            "RatecodeID": nulls_in_block(ratecode),
            "store_and_fwd_flag": nulls_in_block(store_fwd),
            "PULocationID": pc.cast(pu, id_type),
            "DOLocationID": pc.cast(do, id_type),
            "payment_type": payment,
            "fare_amount": fare,
            "extra": extra,
            "mta_tax": mta_tax,
            "tip_amount": tip,
            "tolls_amount": tolls,
            "improvement_surcharge": improvement,
            "total_amount": total,
            "congestion_surcharge": nulls_in_block(congestion),
            self.schema.names[18]: nulls_in_block(fee),  # Airport_fee or airport_fee, by era
        }
        if "cbd_congestion_fee" in self.schema.names:
            cols["cbd_congestion_fee"] = cbd
        return pa.Table.from_pydict(cols, schema=self.schema)

    def _quirks(self, u: pa.Array) -> dict[str, pa.Array]:
        """One boolean mask per quirk, disjoint: each takes its own slice of one uniform draw."""
        masks, low = {}, 0.0
        for name, rate in self.rates.exclusive():
            masks[name] = _and(pc.greater_equal(u, low), pc.less(u, low + rate))
            low += rate
        if low > 1:
            raise KitError("the quirk rates add up to more than 1", "lower the QuirkRates values")
        return masks


def _zone_weights(hot_share: float, airports: dict[int, float]) -> list[float]:
    """Pickup or dropoff probabilities by zone id 1..265: Zipf-like over the busy Manhattan zones,
    airports fixed, and a floor everywhere else so that every one of the 265 zones occurs."""
    p = [0.0] * ZONE_COUNT
    zipf = [1.0 / (k + 1) ** 0.6 for k in range(len(_HOT_MANHATTAN))]
    for z, w in zip(_HOT_MANHATTAN, zipf, strict=False):
        p[z - 1] = hot_share * w / sum(zipf)
    for z, share in airports.items():
        p[z - 1] = share
    p[UNKNOWN_ZONE - 1] = 0.008
    p[OUTSIDE_NYC - 1] = 0.001
    rest = [i for i, v in enumerate(p) if v == 0]
    floor = (1.0 - sum(p)) / len(rest)
    for i in rest:
        p[i] = floor
    return p


def _epoch_s(dt: datetime) -> int:
    """Seconds since 1970-01-01 of a naive wall-clock datetime (no time zone involved)."""
    return int((dt - datetime(1970, 1, 1)).total_seconds())


@dataclass(frozen=True)
class Recipe:
    """What a generated file is made of besides its month, size and seed: `era` the TLC schema ("2025", "2024",
    "2022"; None: the era of the year), `chunk_rows` the rows of each row group (the last one fewer), `rates` the
    quirks' rates."""

    era: str | None = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    rates: QuirkRates = QuirkRates()


def generate_month(
    path: str | os.PathLike,
    year: int,
    month: int,
    rows: int,
    seed: int = 0,
    recipe: Recipe = Recipe(),
) -> GeneratedFile:
    """Write `rows` synthetic trips of `year`-`month` as one TLC-schema Parquet file, made as `recipe` says.

    `path` is the file, or an existing directory to put `yellow_tripdata_YYYY-MM.parquet` in. Memory is bounded by
    one block plus one row group. The file is written to a temporary name and renamed, so a killed run never leaves
    a partial file under the final name.
    """
    era, chunk_rows, rates = recipe.era, recipe.chunk_rows, recipe.rates
    if not (1 <= month <= 12) or not (1900 < year < 2200):
        raise KitError(f"no such month: {year}-{month:02d}", "give a month as YYYY-MM with MM between 01 and 12")
    if rows < 0 or chunk_rows <= 0:
        raise KitError(f"rows must be >= 0 and chunk_rows > 0 (got {rows}, {chunk_rows})", "pass positive sizes")
    if seed < 0:
        raise KitError(f"seed must be a non-negative integer (got {seed})", "pass a seed >= 0")
    era = era or era_for(year)
    if era not in TLC_ERAS:
        raise KitError(f"unknown TLC schema era {era!r}", f"use one of: {', '.join(TLC_ERAS)}")
    path = Path(path)
    if path.is_dir():
        path = path / month_file_name(year, month)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = _MonthModel(year, month, era, seed, rates)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    row_groups = 0
    try:
        with pq.ParquetWriter(tmp, model.schema, compression="snappy") as writer:
            pending: list[pa.Table] = []
            pending_rows = 0
            block = 0
            left = rows
            while left > 0 or pending_rows:
                if left > 0 and pending_rows < chunk_rows:
                    t = model.block(block).slice(0, min(BLOCK_ROWS, left))  # a full block, cut: prefix-stable
                    block += 1
                    left -= t.num_rows
                    pending.append(t)
                    pending_rows += t.num_rows
                    continue
                buf = pa.concat_tables(pending)
                take = min(chunk_rows, buf.num_rows)
                writer.write_table(buf.slice(0, take), row_group_size=take)
                row_groups += 1
                rest = buf.slice(take)
                pending, pending_rows = ([rest], rest.num_rows) if rest.num_rows else ([], 0)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            digest.update(piece)
    return GeneratedFile(path, year, month, era, rows, seed, row_groups, path.stat().st_size, digest.hexdigest())
