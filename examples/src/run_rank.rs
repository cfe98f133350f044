//! One rank of an example: join, run the body, leave.

/// The error type of the examples' rank bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Runs one rank of an example: starts a current-thread tokio runtime, joins
/// the job from the environment with op timeout `timeout`, runs `body` on
/// the world group, then leaves gracefully (`ProcessGroup::shutdown`: no
/// rank exits while another still reads from it).
///
/// # Errors
///
/// Whatever joining, `body` or leaving failed with.
pub fn run_rank<T, F, Fut>(timeout: std::time::Duration, body: F) -> Result<T, BoxError>
where
    F: FnOnce(chorus::ProcessGroup) -> Fut,
    Fut: std::future::Future<Output = Result<T, BoxError>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let pg = chorus::ProcessGroup::builder()
            .timeout(timeout)
            .init_from_env()
            .await?;
        let out = body(pg.clone()).await?;
        pg.shutdown().await?;
        Ok(out)
    })
}
