//! The native core of arrowlake's key path.
//!
//! Kernels work on Arrow arrays (imported without a copy through the C data interface by
//! [`python`]) and return indices, hashes or bytes; Arrow does the column work on the Python
//! side. Every kernel is pure Rust and tested by `cargo test --no-default-features`.

pub mod error;
pub mod hash;
pub mod keys;
pub mod versions;
pub mod runs;
pub mod index;
pub mod vectors;

#[cfg(feature = "python")]
mod python;
