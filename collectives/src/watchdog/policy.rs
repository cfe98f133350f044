//! Applying a group's [`ErrorPolicy`] to its registry.

use std::time::Duration;

use chorus_core::Registry;
use chorus_core::{OpContext, WorkError};

use super::config::ErrorPolicy;

pub(super) fn apply(
    policy: ErrorPolicy,
    reg: &Registry,
    err: &WorkError,
    expired: &[(u64, OpContext, Duration)],
) {
    match policy {
        ErrorPolicy::AbortGroup => {
            reg.abort(err);
        }
        ErrorPolicy::FailWorks => {
            if expired.is_empty() {
                reg.fail_all(err);
            }
            for (id, ctx, after) in expired {
                let e = match err {
                    WorkError::OpTimeout { .. } => WorkError::OpTimeout {
                        ctx: ctx.clone(),
                        after: *after,
                    },
                    other => other.for_op(ctx.clone()),
                };
                reg.fail_one(*id, e);
            }
        }
        ErrorPolicy::AbortProcess => {
            tracing::error!(error = %err, "error policy AbortProcess: aborting the process");
            eprintln!("chorus: aborting the process: {err}");
            std::process::abort();
        }
    }
}
