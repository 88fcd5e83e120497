//! What a kernel can refuse. The Python bindings turn each kind into the exception the numpy
//! path raises for the same input (the wrapper in `arrowlake/native.py` maps them further).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The input is not acceptable (nulls in keys, mismatched lengths, bad bytes).
    Invalid,
    /// A type the kernel does not handle.
    Unsupported,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    pub kind: ErrorKind,
    pub message: String,
}

impl KernelError {
    pub fn invalid(message: impl Into<String>) -> Self {
        KernelError { kind: ErrorKind::Invalid, message: message.into() }
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        KernelError { kind: ErrorKind::Unsupported, message: message.into() }
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for KernelError {}

pub type Result<T> = std::result::Result<T, KernelError>;

/// All columns of a key must be as long as the first.
pub fn check_lengths(lengths: impl IntoIterator<Item = usize>, what: &str) -> Result<usize> {
    let mut iter = lengths.into_iter();
    let first = iter.next().unwrap_or(0);
    for (i, len) in iter.enumerate() {
        if len != first {
            return Err(KernelError::invalid(format!(
                "{what}: column {} has {len} rows, column 0 has {first}",
                i + 1
            )));
        }
    }
    Ok(first)
}
