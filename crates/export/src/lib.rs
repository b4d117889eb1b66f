//! trapline's analyses in the formats other tools read. Each module turns
//! an analysis's report into one format; none analyses anything itself.
//!
//! - [`pprof`]: heap and CPU profiles for `go tool pprof`, Pyroscope and
//!   Grafana.

#![forbid(unsafe_code)]

pub mod pprof;
