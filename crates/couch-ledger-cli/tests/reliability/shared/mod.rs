//! What several parts of the suite use. Each part imports from here, never from another part.

mod check;
mod logs;
mod program;
mod raw;
mod size;
mod tally;
mod world;

pub use check::*;
pub use logs::*;
pub use program::*;
pub use raw::*;
pub use size::*;
pub use tally::*;
pub use world::*;
