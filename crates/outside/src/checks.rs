//! Checks of a release against the block it releases.

use trapline_trace::{AllocFn, ErrorKind, Family};

use crate::heap::Block;

/// How a release does not match its block, as the agent judges it: another
/// family (`free` of a `new` block), a sized release stating another size,
/// or C++ alignment that differs; with what the release gave for the last
/// two. `rsi` and `rdx`: the release's second and third arguments.
pub fn mismatch(func: AllocFn, block: Block, rsi: u64, rdx: u64) -> Option<(ErrorKind, u64)> {
    if block.func.family() != func.family() {
        return Some((ErrorKind::MismatchedFree, 0));
    }
    let (size, align) = match func {
        AllocFn::DeleteSized | AllocFn::DeleteArraySized => (Some(rsi), 0),
        AllocFn::DeleteSizedAligned | AllocFn::DeleteArraySizedAligned => (Some(rsi), rdx),
        f if f.cxx_aligned() => (None, rsi),
        _ => (None, 0),
    };
    if let Some(size) = size.filter(|&s| s != block.size) {
        return Some((ErrorKind::MismatchedSize, size));
    }
    let cxx = func.family() != Family::Malloc;
    (cxx && func.cxx_aligned() != block.func.cxx_aligned())
        .then_some((ErrorKind::MismatchedAlignment, align))
}
