//! trapline's analyses in the formats other tools read. Each module turns
//! an analysis's report into one format; none analyses anything itself.
//!
//! - [`pprof`]: heap and CPU profiles for `go tool pprof`, Pyroscope and
//!   Grafana.
//! - [`html`]: one self-contained page of a process tree, for browsers.
//! - [`parquet`]: the events and stacks as tables, for DuckDB and Spark.
//! - [`perfetto`]: lock waits and holds per thread and the heap over time,
//!   for Perfetto and Chrome DevTools.
//! - [`sarif`]: `leaks` and `deadlocks` findings for code-scanning services.

#![forbid(unsafe_code)]

pub mod html;
pub mod parquet;
pub mod perfetto;
pub mod pprof;
pub mod sarif;
