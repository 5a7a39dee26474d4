//! How backlog takes its own locks: [`lock`], [`read`], [`wait`] and
//! [`wait_timeout`] are std's, except that a lock poisoned by a thread that
//! panicked while holding it is taken anyway.
//!
//! Recovering is right here because backlog's critical sections either
//! guard no data (a gate, `Mutex<()>`) or change it in one step (a push, a
//! remove, a swap, a count): a panic cannot leave it half-written, so a
//! poisoned lock still guards whole data. Refusing it would turn one
//! thread's panic into every other thread's that shares the lock (the
//! fetcher's, the completer's, the caller's of `Queue`), and take down a
//! worker over state that is sound. A lock whose data a panic could leave
//! torn must not be taken through here. Written once, so that this
//! reasoning is too.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::Duration;

/// Locks `mutex`, poisoned or not (see the module's docs).
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes `lock` to read, poisoned or not (see the module's docs).
pub(crate) fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

/// Waits on `changed`, giving `guard` back when woken, poisoned or not.
pub(crate) fn wait<'a, T>(changed: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    changed.wait(guard).unwrap_or_else(|p| p.into_inner())
}

/// Waits on `changed` for at most `timeout`, giving `guard` back when woken
/// or timed out, poisoned or not. The caller checks its condition again
/// either way.
pub(crate) fn wait_timeout<'a, T>(
    changed: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> MutexGuard<'a, T> {
    changed
        .wait_timeout(guard, timeout)
        .unwrap_or_else(|p| p.into_inner())
        .0
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_lock_poisoned_by_a_panic_is_taken_with_its_data() {
        let list = Arc::new(Mutex::new(vec![1]));
        let held = Arc::clone(&list);
        let panicked = std::thread::spawn(move || {
            held.lock().unwrap().push(2);
            let _guard = held.lock().unwrap();
            panic!("poisons the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(list.is_poisoned());
        assert_eq!(*super::lock(&list), vec![1, 2]);
    }
}
