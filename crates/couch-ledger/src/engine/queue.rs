//! A queue with at most one driver: whoever pushes into an idle queue starts its driver task,
//! which takes batches until the queue is empty.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use crate::limits::GATHER_YIELDS_MAX;

pub(super) struct Queue<T> {
    state: Mutex<QueueState<T>>,
}

struct QueueState<T> {
    items: VecDeque<T>,
    /// A driver task is running (or about to): pushers must not start another.
    driving: bool,
}

impl<T> Queue<T> {
    pub(super) fn new() -> Queue<T> {
        Queue {
            state: Mutex::new(QueueState {
                items: VecDeque::new(),
                driving: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState<T>> {
        // A panic elsewhere while holding this short lock leaves plain data behind: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends; `true` when the caller must start the driver.
    pub(super) fn push(&self, items: impl IntoIterator<Item = T>) -> bool {
        let mut s = self.lock();
        s.items.extend(items);
        !std::mem::replace(&mut s.driving, true)
    }

    /// Marks the queue driven when it was not: `true` when the caller must start the driver
    /// (after a [`Queue::push_front`]; from the driver itself, as `Pair::answer` calls it, it
    /// is always `false`: the guard for a call from anywhere else).
    pub(super) fn start_if_idle(&self) -> bool {
        let mut s = self.lock();
        !std::mem::replace(&mut s.driving, true)
    }

    /// Puts items back at the head, in order (deferred to the next round).
    pub(super) fn push_front(&self, items: Vec<T>) {
        let mut s = self.lock();
        for item in items.into_iter().rev() {
            s.items.push_front(item);
        }
    }

    fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Lets the tasks woken by the last answers run before a batch is taken, so that their next
    /// steps join it instead of waiting a whole request for the one after: yields to the runtime
    /// until the queue stops growing for two turns, at most [`GATHER_YIELDS_MAX`] times (no
    /// timer: a few microseconds when nothing more comes).
    pub(super) async fn gather(&self) {
        let mut last = self.len();
        let mut stable = 0;
        for _ in 0..GATHER_YIELDS_MAX {
            tokio::task::yield_now().await;
            let n = self.len();
            if n == last {
                stable += 1;
                if stable >= 2 {
                    return;
                }
            } else {
                stable = 0;
                last = n;
            }
        }
    }

    /// Takes up to `max` items. An empty answer also ends the driver's turn, atomically with
    /// the emptiness check, so a concurrent push either lands in this driver's next round or
    /// starts a new driver.
    pub(super) fn take(&self, max: usize) -> Vec<T> {
        let mut s = self.lock();
        let n = s.items.len().min(max);
        let batch: Vec<T> = s.items.drain(..n).collect();
        if batch.is_empty() {
            s.driving = false;
        }
        batch
    }
}

/// Ends a driver's turn if it stops abnormally (a panic): the waiting callers get an error
/// instead of hanging, and the next push starts a new driver.
pub(super) struct DriverGuard<'a, T> {
    pub(super) queue: &'a Queue<T>,
    pub(super) armed: bool,
}

impl<T> Drop for DriverGuard<'_, T> {
    fn drop(&mut self) {
        if self.armed {
            let mut s = self.queue.lock();
            s.items.clear();
            s.driving = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_take_ends_the_turn() {
        let q: Queue<u32> = Queue::new();
        assert!(q.push([1, 2]));
        assert!(!q.push([3]), "one driver at a time");
        assert_eq!(q.take(2), vec![1, 2]);
        assert_eq!(q.take(2), vec![3]);
        assert!(q.take(2).is_empty());
        assert!(q.push([4]), "the next push starts a driver again");
    }
}
