"""The shop database behind the `sql` tool: seeded data, a read-only SQLite view of it.

`shop_data(seed)` draws customers, products and orders from `random.Random`
seeded by a string, so the data is the same in every process. It is built once
per process and seed, serialized once (`shop_image`), and each environment
deserializes its own in-memory copy (`ReadOnlyStore`), which takes well under a
millisecond: environments never share a connection.

Threat model: the query is model-written SQL. The copy is private to one
environment, and is guarded three ways: `PRAGMA query_only=ON`, an authorizer
that allows only reading (SELECT, reading columns, calling functions,
recursive CTEs) and denies everything else (writes, DDL, ATTACH, PRAGMA,
transactions), and a progress handler that interrupts a query after
`TIME_LIMIT_S`. String and blob sizes are capped with `setlimit`, and results
are cut at `MAX_ROWS` rows. Every refusal raises `ValueError` for the model.
"""

from __future__ import annotations

import functools
import random
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import date, timedelta

SCHEMA_SQL = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, city TEXT NOT NULL);
CREATE TABLE products (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, category TEXT NOT NULL, price REAL NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    product_id INTEGER NOT NULL REFERENCES products(id),
    quantity INTEGER NOT NULL,
    order_date TEXT NOT NULL
);
"""

SCHEMA_TEXT = (
    "customers(id INTEGER PRIMARY KEY, name TEXT, city TEXT)\n"
    "products(id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL)  -- unit price\n"
    "orders(id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), "
    "product_id INTEGER REFERENCES products(id), quantity INTEGER, "
    "order_date TEXT)  -- 'YYYY-MM-DD'"
)
"""The schema as the model reads it in the system prompt."""

YEARS = (2022, 2023, 2024)
N_CUSTOMERS, N_PRODUCTS, N_ORDERS = 60, 40, 400
MAX_ROWS = 50
MAX_QUERY_CHARS = 2000
TIME_LIMIT_S = 1.0
_MAX_VALUE_BYTES = 100_000


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_FIRST = _words(
    "Alice Bruno Chloe Dmitri Elena Farah Georg Hana Ivan Julia Kenji Lena Marco Nadia Omar "
    "Priya Quentin Rosa Samir Tara Umar Vera Wei Ximena Yusuf Zoe Aaron Bella Carlos Diana"
)
_LAST = _words(
    "Chen Garcia Novak Okafor Silva Tanaka Weber Kowalski Haddad Larsen Moreau Rossi Singh "
    "Ivanova Costa Nguyen Fischer Park Lopez Murphy"
)
_CITIES = _words("Lisbon Osaka Toronto Nairobi Krakow Denver Lyon Pune")
_COLORS = _words("Blue Red Green Black White Silver Golden Orange Purple Teal Ivory Copper")
_ITEMS = {
    "Kettle": "kitchen",
    "Toaster": "kitchen",
    "Blender": "kitchen",
    "Skillet": "kitchen",
    "Lamp": "home",
    "Cushion": "home",
    "Clock": "home",
    "Vase": "home",
    "Backpack": "outdoor",
    "Tent": "outdoor",
    "Bottle": "outdoor",
    "Headphones": "electronics",
    "Speaker": "electronics",
    "Keyboard": "electronics",
    "Notebook": "office",
}


@dataclass(frozen=True)
class ShopData:
    """The rows of the three tables; prices in whole cents, so sums are exact."""

    customers: tuple[tuple[int, str, str], ...]  # id, name, city
    products: tuple[tuple[int, str, str, int], ...]  # id, name, category, price in cents
    orders: tuple[tuple[int, int, int, int, str], ...]  # id, customer, product, qty, date


@functools.lru_cache(maxsize=16)
def shop_data(seed: int) -> ShopData:
    """The seeded shop: N_CUSTOMERS customers, N_PRODUCTS products, N_ORDERS orders."""
    rng = random.Random(f"agentgym/tool_call/shop/{seed}")
    names = rng.sample([f"{f} {last}" for f in _FIRST for last in _LAST], N_CUSTOMERS)
    customers = tuple((i, name, rng.choice(_CITIES)) for i, name in enumerate(names, start=1))
    goods = rng.sample([(c, item) for c in _COLORS for item in _ITEMS], N_PRODUCTS)
    products = tuple(
        (i, f"{color} {item}", _ITEMS[item], rng.randrange(299, 20_000))
        for i, (color, item) in enumerate(goods, start=1)
    )
    first_day = date(YEARS[0], 1, 1)
    days = (date(YEARS[-1], 12, 31) - first_day).days + 1
    orders = tuple(
        (
            i,
            rng.randint(1, N_CUSTOMERS),
            rng.randint(1, N_PRODUCTS),
            rng.randint(1, 5),
            (first_day + timedelta(days=rng.randrange(days))).isoformat(),
        )
        for i in range(1, N_ORDERS + 1)
    )
    return ShopData(customers, products, orders)


@functools.lru_cache(maxsize=16)
def shop_image(seed: int) -> bytes:
    """The seeded shop as a serialized SQLite database, built once per process and seed."""
    data = shop_data(seed)
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(SCHEMA_SQL)
        conn.executemany("INSERT INTO customers VALUES (?, ?, ?)", data.customers)
        conn.executemany(
            "INSERT INTO products VALUES (?, ?, ?, ?)",
            [(i, name, cat, cents / 100) for i, name, cat, cents in data.products],
        )
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", data.orders)
        conn.commit()
        return conn.serialize()
    finally:
        conn.close()


_READ_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)


def _authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, _: object) -> int:
    return sqlite3.SQLITE_OK if action in _READ_ACTIONS else sqlite3.SQLITE_DENY


def _cell(value: object) -> object:
    """A value as shown and compared: floats rounded off their binary noise."""
    if isinstance(value, float):
        value = round(value, 6)
        return int(value) if value.is_integer() else value
    return value


class ReadOnlyStore:
    """One environment's private, read-only copy of the shop; thread-safe."""

    def __init__(self, seed: int):
        self.seed = seed
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._deadline = 0.0

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:  # opened on first use, so building an env stays cheap
            conn = sqlite3.connect(":memory:", check_same_thread=False)
            conn.deserialize(shop_image(self.seed))
            conn.execute("PRAGMA query_only = ON")
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
            conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_QUERY_CHARS * 4)
            conn.set_authorizer(_authorize)
            conn.set_progress_handler(self._over_time, 1000)
            self._conn = conn
        return self._conn

    def _over_time(self) -> int:
        return int(time.monotonic() > self._deadline)

    def rows(self, query: str, limit: int = MAX_ROWS) -> tuple[list[str], list[tuple]]:
        """Column names and up to `limit + 1` rows of `query`; ValueError if refused."""
        if not isinstance(query, str) or not query.strip():
            raise ValueError("the query must be a non-empty SQL string")
        if len(query) > MAX_QUERY_CHARS:
            raise ValueError(f"the query is longer than {MAX_QUERY_CHARS} characters")
        with self._lock:
            conn = self._connection()
            self._deadline = time.monotonic() + TIME_LIMIT_S
            try:
                cursor = conn.execute(query)
                found = cursor.fetchmany(limit + 1)
                columns = [d[0] for d in cursor.description or ()]
                cursor.close()
            except (sqlite3.Error, sqlite3.Warning) as err:
                raise ValueError(self._explain(err)) from None
        return columns, [tuple(_cell(v) for v in row) for row in found]

    def _explain(self, err: Exception) -> str:
        text = str(err)
        if text == "interrupted":
            return f"the query ran longer than {TIME_LIMIT_S:g} s and was stopped"
        if any(s in text for s in ("not authorized", "authorization denied", "readonly")):
            return "not allowed: the database is read-only; only SELECT queries may run"
        return f"SQL error: {text}"

    def run(self, query: str) -> str:
        """The `sql` tool's body: the result of a SELECT as a compact text table."""
        columns, found = self.rows(query)
        lines = [" | ".join(columns)] if columns else []
        lines += [" | ".join("NULL" if v is None else str(v) for v in row) for row in found]
        if not found:
            lines.append("(no rows)")
        elif len(found) > MAX_ROWS:
            lines[-1] = f"... more than {MAX_ROWS} rows; aggregate or add LIMIT"
        return "\n".join(lines)

    def same_result(self, expected: str, actual: object) -> bool:
        """Whether two queries return the same rows, in any order; False if either fails."""
        try:
            want = self.rows(expected, limit=1000)[1]
            got = self.rows(actual, limit=1000)[1]  # type: ignore[arg-type]
        except ValueError:
            return False
        return sorted(map(repr, want)) == sorted(map(repr, got))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
