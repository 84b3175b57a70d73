//! The reactor: the I/O threads of a process, each an epoll loop over the sockets assigned to it.
use super::{NetConfig, REACTOR_TICK};
use crate::error::{Error, Result};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

/// What the reactor drives: a stream, a listener, a stream saying hello, a dial. The reactor
/// knows its clients only through this.
pub(super) trait Ready: Send + Sync {
    /// A socket event for this entry's token.
    fn ready(self: Arc<Self>, readable: bool, writable: bool);
    /// Once per `REACTOR_TICK`, for entries registered to be ticked (`Entry::Ticked`,
    /// `Entry::Held`): deadlines and retries no socket event announces.
    fn tick(self: Arc<Self>) {}
}

pub(super) enum Entry {
    /// Driven by its socket events while its owner keeps it alive.
    Watched(Weak<dyn Ready>),
    /// As `Watched`, and ticked too (a listener: handshake deadlines, accepts that failed).
    Ticked(Weak<dyn Ready>),
    /// Held here, strongly, until it ends, so that it goes on whatever its owner does, and
    /// ticked (a dial in progress, dial.rs: all its sockets share its token; a hello).
    Held(Arc<dyn Ready>),
}

impl Entry {
    fn get(&self) -> Option<Arc<dyn Ready>> {
        match self {
            Entry::Watched(w) | Entry::Ticked(w) => w.upgrade(),
            Entry::Held(a) => Some(a.clone()),
        }
    }

    fn ticked(&self) -> Option<Arc<dyn Ready>> {
        match self {
            Entry::Watched(_) => None,
            _ => self.get(),
        }
    }
}

pub(super) struct IoThread {
    pub(super) registry: Registry,
    pub(super) waker: Waker,
    pub(super) entries: Mutex<HashMap<usize, Entry>>,
}

/// The I/O threads of a process, shared by every connection and listener.
pub struct Reactor {
    pub(super) threads: Vec<Arc<IoThread>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
    stop: Arc<AtomicBool>,
    pub(super) next_token: AtomicUsize,
    next_thread: AtomicUsize,
}

const WAKER: Token = Token(0);

impl Reactor {
    pub fn new(cfg: &NetConfig) -> Result<Arc<Reactor>> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut handles = Vec::new();
        for i in 0..cfg.io_threads.max(1) {
            let poll = Poll::new().map_err(|_| Error::os("epoll_create"))?;
            let registry = poll.registry().try_clone().map_err(|_| Error::os("epoll dup"))?;
            let waker = Waker::new(poll.registry(), WAKER).map_err(|_| Error::os("eventfd"))?;
            let t = Arc::new(IoThread { registry, waker, entries: Mutex::new(HashMap::new()) });
            let (t2, stop2) = (t.clone(), stop.clone());
            let h = std::thread::Builder::new()
                .name(format!("wirespeed-io{i}"))
                .spawn(move || io_loop(poll, &t2, &stop2))
                .map_err(|e| Error::Unsupported(format!("cannot start a wirespeed I/O thread: {e}")))?;
            threads.push(t);
            handles.push(h);
        }
        Ok(Arc::new(Reactor { threads, handles: Mutex::new(handles), stop, next_token: AtomicUsize::new(1), next_thread: AtomicUsize::new(0) }))
    }

    /// One reactor per process for the collective groups, made on first use with the first
    /// group's `io_threads`. A later group that asks for another count is refused (every group
    /// of a process shares these threads, so its count could not be honoured).
    pub fn global(cfg: &NetConfig) -> Result<Arc<Reactor>> {
        static GLOBAL: OnceLock<Arc<Reactor>> = OnceLock::new();
        let r = match GLOBAL.get() {
            Some(r) => r.clone(),
            None => {
                let r = Reactor::new(cfg)?;
                GLOBAL.get_or_init(|| r).clone()
            }
        };
        r.shared_with(cfg)?;
        Ok(r)
    }

    /// Whether a group configured by `cfg` may share this reactor: the same I/O thread count.
    fn shared_with(&self, cfg: &NetConfig) -> Result<()> {
        let (have, want) = (self.threads.len(), cfg.io_threads.max(1));
        if have != want {
            return Err(Error::Unsupported(format!(
                "this group asks for {want} I/O thread(s) (WIRESPEED_IO_THREADS), but this process's \
                 groups already run on {have}: every group of a process shares its I/O threads, so \
                 give every group the same count"
            )));
        }
        Ok(())
    }

    pub(super) fn pick(&self) -> usize {
        self.next_thread.fetch_add(1, Relaxed) % self.threads.len()
    }

    pub(super) fn register(&self, thread: usize, fd: i32, interest: Interest, entry: Entry) -> Result<usize> {
        let token = self.next_token.fetch_add(1, Relaxed);
        let t = &self.threads[thread];
        t.entries.lock().unwrap().insert(token, entry);
        if let Err(e) = t.registry.register(&mut SourceFd(&fd), Token(token), interest) {
            t.entries.lock().unwrap().remove(&token);
            return Err(Error::Unsupported(format!("cannot register a socket with epoll: {e}")));
        }
        Ok(token)
    }

    /// Watch `fd` under an entry already in `thread`'s table (a dial's sockets share its token).
    pub(super) fn watch(&self, thread: usize, token: usize, fd: i32, interest: Interest) -> Result<()> {
        self.threads[thread].registry.register(&mut SourceFd(&fd), Token(token), interest).map_err(|e| Error::Unsupported(format!("cannot register a socket with epoll: {e}")))
    }

    pub(super) fn unwatch(&self, thread: usize, fd: i32) {
        let _ = self.threads[thread].registry.deregister(&mut SourceFd(&fd));
    }

    pub(super) fn forget(&self, thread: usize, token: usize, fd: i32) {
        let t = &self.threads[thread];
        let _ = t.registry.deregister(&mut SourceFd(&fd));
        t.entries.lock().unwrap().remove(&token);
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        for t in &self.threads {
            let _ = t.waker.wake();
        }
        for h in self.handles.lock().unwrap().drain(..) {
            let _ = h.join();
        }
    }
}

fn io_loop(mut poll: Poll, t: &IoThread, stop: &AtomicBool) {
    let mut events = Events::with_capacity(256);
    let mut last_tick = Instant::now();
    while !stop.load(Acquire) {
        if let Err(e) = poll.poll(&mut events, Some(REACTOR_TICK)) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                eprintln!("wirespeed: epoll failed ({e}); the I/O thread stops");
                return;
            }
        }
        for ev in events.iter() {
            if ev.token() == WAKER {
                continue;
            }
            let Some(entry) = t.entries.lock().unwrap().get(&ev.token().0).and_then(Entry::get) else { continue };
            entry.ready(
                ev.is_readable() || ev.is_read_closed() || ev.is_error(),
                ev.is_writable() || ev.is_write_closed(),
            );
        }
        if last_tick.elapsed() >= REACTOR_TICK {
            last_tick = Instant::now();
            // Listeners expire handshakes and retry accepts; dials retry and meet deadlines.
            let ticked: Vec<Arc<dyn Ready>> = t.entries.lock().unwrap().values().filter_map(Entry::ticked).collect();
            for e in ticked {
                e.tick();
            }
        }
    }
}
