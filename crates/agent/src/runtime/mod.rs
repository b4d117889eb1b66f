//! Start and finish: the constructor, the exit and fatal-signal paths,
//! fork and exec. The only layer that knows every service; it registers
//! the callbacks the layers below call up through.

pub mod attach;
pub mod exec_target;
pub mod fatal_signals;
pub mod inline_alloc;
pub mod lifecycle;
