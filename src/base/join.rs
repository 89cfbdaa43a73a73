//! Two independent steps run at once, failing as the first of them in order would.

use std::future::Future;

/// Both values, `primary` and `secondary` run at once. `primary`'s failure is returned as
/// soon as it comes and wins over `secondary`'s, which is then not waited for: a run that
/// would have stopped at `primary` run first stops with the same error, no later.
pub async fn primary_first<A, B, E>(
    primary: impl Future<Output = Result<A, E>>,
    secondary: impl Future<Output = Result<B, E>>,
) -> Result<(A, B), E> {
    tokio::pin!(primary, secondary);
    let mut secondary_done = None;
    let primary = loop {
        tokio::select! {
            done = &mut primary => break done?,
            done = &mut secondary, if secondary_done.is_none() => secondary_done = Some(done),
        }
    };
    let secondary = match secondary_done {
        Some(done) => done?,
        None => secondary.await?,
    };
    Ok((primary, secondary))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn after<T>(millis: u64, value: T) -> T {
        tokio::time::sleep(Duration::from_millis(millis)).await;
        value
    }

    #[tokio::test(start_paused = true)]
    async fn the_primary_failure_wins_and_is_not_held_up_by_the_secondary() {
        let started = tokio::time::Instant::now();
        let failed = primary_first(
            after(10, Err::<(), _>("primary")),
            after(60_000, Err::<(), _>("secondary")),
        )
        .await;
        assert_eq!(failed, Err("primary"));
        assert!(started.elapsed() < Duration::from_secs(1));
        // The secondary failed first, but the primary's failure is the one told.
        let failed = primary_first(
            after(10, Err::<(), _>("primary")),
            after(1, Err::<(), _>("secondary")),
        )
        .await;
        assert_eq!(failed, Err("primary"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_secondary_failure_is_told_once_the_primary_succeeds() {
        let both = primary_first(
            after(10, Ok::<_, &str>(1)),
            after(1, Err::<u8, _>("secondary")),
        );
        assert_eq!(both.await, Err("secondary"));
        let both = primary_first(after(1, Ok::<_, &str>(1)), after(10, Ok(2)));
        assert_eq!(both.await, Ok((1, 2)));
    }
}
