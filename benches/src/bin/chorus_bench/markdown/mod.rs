//! The report: `header` (where a section's figures come from: the machine,
//! the commit, the command, the date), `store`, `tcp`, `checked` and
//! `nccl` (each comparison's sections), `file` (each section's place
//! between its markers in the file).

mod checked;
mod file;
mod header;
mod nccl;
mod store;
mod tcp;

pub(crate) use checked::checked_section;
#[cfg(test)]
pub(crate) use file::{begin, end};
pub(crate) use file::{relative, splice};
pub(crate) use header::{commit_here, machine, shell_quote, utc_now, Provenance};
pub(crate) use nccl::{groups_section, nccl_section, raw_section};
pub(crate) use store::store_section;
pub(crate) use tcp::tcp_section;
