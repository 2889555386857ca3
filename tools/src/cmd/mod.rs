pub mod bench;
pub mod cat;
pub mod demo;
pub mod gen;
pub mod index;
pub mod probe;
pub mod read;
pub mod shuffle;
