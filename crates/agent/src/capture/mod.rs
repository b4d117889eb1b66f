//! What the program's code is: its loaded modules, the unwind rules
//! taken from them, the unwinder and the table of interned stacks.

pub mod modules;
pub mod private_operators;
pub mod rules;
pub mod stacks;
pub mod unwind;
