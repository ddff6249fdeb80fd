"""Reading a manifest through fsspec, one record batch at a time.

The file is opened through fsspec (any URL: local paths, `memory://`, `s3://`, `gs://`), its schema is
checked before any row is read, and rows come out in record batches of at most `batch_rows` rows, read row
group by row group, so a manifest of millions of rows never sits in memory as one table.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from genbatch.manifests.schema import ManifestFileError, ManifestSchema, check_schema

DEFAULT_BATCH_ROWS = 16_384
"""Rows per record batch: large enough to amortise Arrow's per-batch cost, small enough to bound memory."""

_WRITE_HINT = "write it with pyarrow.parquet.write_table(table, path) or pandas DataFrame.to_parquet(path)"


class ManifestReader:
    """An open manifest: its checked schema, its row count, and its rows as column lists, batch by batch.

        with ManifestReader("s3://bucket/m.parquet", storage_options={"anon": False}) as reader:
            for first_row, columns in reader.batches():   # columns: {name: [python values]}
                ...

    Opening raises `ManifestFileError` when the file is missing, is not Parquet, or fails `check_schema`.
    """

    def __init__(self, url: str, *, storage_options: dict | None = None, batch_rows: int = DEFAULT_BATCH_ROWS) -> None:
        if batch_rows <= 0:
            raise ValueError(f"batch_rows={batch_rows} must be positive; use e.g. {DEFAULT_BATCH_ROWS}")
        self.url = str(url)
        """The manifest's URL as given."""
        self.storage_options = dict(storage_options or {})
        """fsspec options for the URL's filesystem (credentials, endpoint, ...)."""
        self.batch_rows = batch_rows
        """The most rows one batch holds."""
        self._file = None
        self._parquet: pq.ParquetFile | None = None
        self._schema: ManifestSchema | None = None

    def __enter__(self) -> ManifestReader:
        try:
            self._file = fsspec.open(self.url, "rb", **self.storage_options).open()
        except FileNotFoundError:
            raise ManifestFileError(f"{self.url}: no such manifest; check the path or URL", url=self.url) from None
        except Exception as error:  # fsspec backends raise their own kinds (botocore, gcsfs, ...)
            raise ManifestFileError(
                f"{self.url}: cannot open the manifest ({type(error).__name__}: {error}); check the URL and "
                "--storage-option settings",
                url=self.url,
            ) from error
        try:
            self._parquet = pq.ParquetFile(self._file)
            self._schema = check_schema(self._parquet.schema_arrow, self.url)
        except ManifestFileError:
            self.close()
            raise
        except (pa.ArrowException, OSError) as error:
            self.close()
            raise ManifestFileError(f"{self.url}: not a Parquet file ({error}); {_WRITE_HINT}", url=self.url) from error
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, traceback: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying file (idempotent)."""
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def _opened(self) -> pq.ParquetFile:
        if self._parquet is None:
            raise RuntimeError("ManifestReader is not open; use it as a context manager: with ManifestReader(url) as r")
        return self._parquet

    @property
    def schema(self) -> ManifestSchema:
        """The checked schema."""
        self._opened()
        return self._schema

    @property
    def rows(self) -> int:
        """Rows in the file (from the Parquet footer; nothing is read)."""
        return self._opened().metadata.num_rows

    @property
    def row_groups(self) -> int:
        """Row groups in the file."""
        return self._opened().metadata.num_row_groups

    def record_batches(self) -> Iterator[pa.RecordBatch]:
        """The rows as Arrow record batches of at most `batch_rows` rows, in file order."""
        parquet = self._opened()
        for group in range(parquet.metadata.num_row_groups):
            try:
                yield from parquet.iter_batches(batch_size=self.batch_rows, row_groups=[group])
            except (pa.ArrowException, OSError) as error:
                raise ManifestFileError(
                    f"{self.url}: row group {group} cannot be read ({error}); the file is damaged, {_WRITE_HINT} again",
                    url=self.url,
                ) from error

    def column(self, name: str) -> pa.ChunkedArray:
        """One column of every row, in file order (only that column is read)."""
        parquet = self._opened()
        try:
            return parquet.read(columns=[name]).column(0)
        except (pa.ArrowException, OSError) as error:
            raise ManifestFileError(
                f"{self.url}: column {name!r} cannot be read ({error}); the file is damaged, {_WRITE_HINT} again",
                url=self.url,
                column=name,
            ) from error

    def batches(self) -> Iterator[tuple[int, dict[str, list]]]:
        """(index of the batch's first row, {column: Python values}) for each record batch, in file order."""
        first = 0
        for batch in self.record_batches():
            yield first, {name: batch.column(index).to_pylist() for index, name in enumerate(batch.schema.names)}
            first += batch.num_rows

    def column_batches(self, names: list[str]) -> Iterator[pa.RecordBatch]:
        """Only the named columns as record batches, in file order (a check over a few columns of a large
        manifest reads nothing else)."""
        parquet = self._opened()
        try:
            yield from parquet.iter_batches(batch_size=self.batch_rows, columns=list(names))
        except (pa.ArrowException, OSError) as error:
            raise ManifestFileError(f"{self.url}: cannot be read ({error}); {_WRITE_HINT} again", url=self.url) from error
