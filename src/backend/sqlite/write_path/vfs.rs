//! A shim VFS that knows which thread holds a database file's write lock, so
//! that a queue call made inside the application's own write transaction on
//! the same file answers [`Error::InsideTransaction`](crate::Error) at once
//! instead of waiting for its own thread until the write deadline.
//!
//! Why it exists: an application opens its own `rusqlite::Connection` on the
//! queue's file, runs `BEGIN IMMEDIATE` (or writes in a deferred
//! transaction), and on the same thread calls `queue.enqueue(..)`. The
//! queue's writer then waits in SQLite's busy handler for a lock its own
//! thread holds: `Error::Busy` after 30 s, a frozen caller meanwhile. SQLite
//! has no API that says who holds the lock, but in WAL mode every connection
//! takes it through its VFS: `xShmLock(0, 1, LOCK | EXCLUSIVE)` on the main
//! database file's handle (`WAL_WRITE_LOCK` in `wal.c`), released by the same
//! call with `UNLOCK`, or with the whole shared memory at `xShmUnmap`/`xClose`.
//!
//! So [`register`] wraps the process's default VFS (`unix`) once, at the
//! first `Queue::open`, under the name [`NAME`], **not** as the default: a
//! process's SQLite connections are the application's business (DESIGN.md §2,
//! promise 10). The queue's write and checkpoint connections open through it
//! by name; an application's connection does only if the application asks
//! (`backlog::sqlite::open_connection`, or [`make_default`] through
//! `backlog::sqlite::make_default_vfs`). The wrapper forwards every method
//! unchanged (every return code included) and, in `xShmLock`, notes which
//! file handle holds the write lock of which database file (by
//! `st_dev`/`st_ino`, as the unix VFS itself identifies files) and which
//! thread took it. The queue's write path asks
//! [`WriterFile::locked_elsewhere_by_this_thread`] before it waits for
//! anything.
//!
//! The note is kept per file handle in one process-wide table, not in a
//! thread-local: a `rusqlite::Connection` is `Send`, and the lock it took on
//! one thread may be released on another; a thread-local flag would then
//! stay set forever. A lock is attributed to the thread that took it.
//!
//! Not covered, and waited for as before (bounded by the write deadline):
//! connections that do not go through the shim (the application's, unless it
//! opted in), and connections in `locking_mode=EXCLUSIVE` (SQLite then takes
//! no shared-memory locks). The queue's read pool opens plainly: readers
//! never take the write lock. Unix only; elsewhere nothing is registered and
//! every connection opens with SQLite's default VFS.

/// The shim's name, as connections ask for it.
pub(crate) const NAME: &str = "backlog";

/// Opens `path` with `flags` through the shim when it is registered (see
/// [`register`]), else with SQLite's default VFS: writes stay correct and
/// bounded without it.
pub(crate) fn open(
    path: &std::path::Path,
    flags: rusqlite::OpenFlags,
) -> rusqlite::Result<rusqlite::Connection> {
    if register() {
        rusqlite::Connection::open_with_flags_and_vfs(path, flags, NAME)
    } else {
        rusqlite::Connection::open_with_flags(path, flags)
    }
}

#[cfg(unix)]
pub(crate) use unix::{make_default, register, WriterFile};

#[cfg(not(unix))]
pub(crate) use fallback::{make_default, register, WriterFile};

#[cfg(not(unix))]
mod fallback {
    /// Nothing to register off unix.
    pub(crate) fn register() -> bool {
        false
    }

    /// Nothing to make the default off unix.
    pub(crate) fn make_default() -> bool {
        false
    }

    /// Off unix no write lock is known: the queue waits, bounded.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct WriterFile;

    impl WriterFile {
        pub(crate) fn of(_conn: &rusqlite::Connection) -> Option<WriterFile> {
            None
        }

        pub(crate) fn locked_elsewhere_by_this_thread(&self) -> bool {
            false
        }
    }
}

#[cfg(unix)]
mod unix {
    use std::cell::Cell;
    use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::ptr;
    use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
    use std::sync::{Mutex, Once};

    use rusqlite::ffi::{
        sqlite3_file, sqlite3_int64, sqlite3_io_methods, sqlite3_syscall_ptr, sqlite3_vfs,
        SQLITE_ERROR, SQLITE_FCNTL_FILE_POINTER, SQLITE_OK, SQLITE_OPEN_MAIN_DB,
        SQLITE_SHM_EXCLUSIVE, SQLITE_SHM_LOCK, SQLITE_SHM_UNLOCK,
    };

    use crate::sync;

    /// A database file, as the unix VFS tells files apart.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct DbFile {
        dev: u64,
        ino: u64,
    }

    /// A file handle of the shim: SQLite sees `base` (our io methods); the
    /// wrapped VFS's handle lives right behind this header, in the same
    /// allocation (`szOsFile` counts both).
    #[repr(C)]
    struct ShimFile {
        base: sqlite3_file,
        real: *mut sqlite3_file,
        /// Set for a main database file that could be stat'ed at open.
        db: Option<DbFile>,
    }

    /// Where the wrapped handle starts: SQLite allocates handles 8-aligned.
    const HEADER: usize = std::mem::size_of::<ShimFile>().next_multiple_of(8);

    /// A write lock taken through one of the shim's handles.
    struct Holder {
        file: usize,
        db: DbFile,
        thread: u64,
    }

    /// Every write lock held right now in this process (a few entries at
    /// most: one per connection inside a write transaction).
    static HOLDERS: Mutex<Vec<Holder>> = Mutex::new(Vec::new());

    /// The shim's io methods, one table per table of the wrapped VFS (the
    /// unix VFS has a few, one per locking style), each offering exactly
    /// the methods the wrapped one has.
    static METHODS: Mutex<Vec<(usize, &'static sqlite3_io_methods)>> = Mutex::new(Vec::new());

    // Nothing here can panic while holding these tables' locks; if something
    // did, the tables are still whole (one push or retain at a time), so
    // `sync::lock` may take them poisoned.

    static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

    thread_local! {
        /// This thread's number in the table (0: none yet). Not
        /// `thread::current()`, which may panic while a thread's locals are
        /// torn down (a connection closed in a destructor).
        static THREAD: Cell<u64> = const { Cell::new(0) };
    }

    /// This thread's number, 0 if it cannot be had (its locals are gone).
    fn this_thread() -> u64 {
        THREAD
            .try_with(|id| {
                if id.get() == 0 {
                    id.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
                }
                id.get()
            })
            .unwrap_or(0)
    }

    /// The shim's `sqlite3_vfs` once registered (null: not registered).
    static SHIM: AtomicPtr<sqlite3_vfs> = AtomicPtr::new(ptr::null_mut());

    /// Registers the shim under
    /// [`NAME`](crate::backend::sqlite::write_path::vfs::NAME), wrapping the
    /// current default VFS, once per process, without making it the default: only
    /// connections that name it go through it. True when it is registered.
    pub(crate) fn register() -> bool {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            // SAFETY: sqlite3_vfs_find and sqlite3_vfs_register are
            // thread-safe (SQLite is built threadsafe) and initialize SQLite
            // themselves. The shim's sqlite3_vfs is leaked: SQLite keeps the
            // pointer for the life of the process, and it is never
            // unregistered.
            let registered = unsafe {
                let real = rusqlite::ffi::sqlite3_vfs_find(ptr::null());
                if real.is_null() {
                    Err(SQLITE_ERROR)
                } else {
                    let shim = Box::leak(Box::new(shim_vfs(&*real, real)));
                    match rusqlite::ffi::sqlite3_vfs_register(shim, 0) {
                        SQLITE_OK => Ok(shim as *mut sqlite3_vfs),
                        rc => Err(rc),
                    }
                }
            };
            match registered {
                Ok(shim) => SHIM.store(shim, Ordering::Release),
                // Writes stay correct and bounded without it.
                Err(rc) => tracing::warn!(
                    rc,
                    "the SQLite shim VFS could not be registered: a queue call inside \
                     a write transaction of another connection waits for the write deadline"
                ),
            }
        });
        !SHIM.load(Ordering::Acquire).is_null()
    }

    /// Makes the shim the process's default VFS (registering it first):
    /// connections opened from then on without a VFS name go through it.
    /// True when it is the default.
    pub(crate) fn make_default() -> bool {
        if !register() {
            return false;
        }
        let shim = SHIM.load(Ordering::Acquire);
        // SAFETY: `shim` is the registered, leaked shim VFS; registering a
        // registered VFS again only moves it (here: to the head, the
        // default), under SQLite's own mutex.
        unsafe { rusqlite::ffi::sqlite3_vfs_register(shim, 1) == SQLITE_OK }
    }

    /// The shim's VFS over `real`: the same capabilities, each method
    /// forwarded (`pAppData` is `real`), files opened through [`open`].
    fn shim_vfs(r: &sqlite3_vfs, real: *mut sqlite3_vfs) -> sqlite3_vfs {
        let version = r.iVersion.min(3);
        let v2 = version >= 2;
        let v3 = version >= 3;
        sqlite3_vfs {
            iVersion: version,
            szOsFile: r.szOsFile + HEADER as c_int,
            mxPathname: r.mxPathname,
            pNext: ptr::null_mut(),
            // NAME, NUL-terminated.
            zName: c"backlog".as_ptr(),
            pAppData: real.cast(),
            xOpen: Some(open),
            xDelete: r.xDelete.and(Some(delete)),
            xAccess: r.xAccess.and(Some(access)),
            xFullPathname: r.xFullPathname.and(Some(full_pathname)),
            xDlOpen: r.xDlOpen.and(Some(dl_open)),
            xDlError: r.xDlError.and(Some(dl_error)),
            xDlSym: r.xDlSym.and(Some(dl_sym)),
            xDlClose: r.xDlClose.and(Some(dl_close)),
            xRandomness: r.xRandomness.and(Some(randomness)),
            xSleep: r.xSleep.and(Some(sleep)),
            xCurrentTime: r.xCurrentTime.and(Some(current_time)),
            xGetLastError: r.xGetLastError.and(Some(get_last_error)),
            xCurrentTimeInt64: r
                .xCurrentTimeInt64
                .filter(|_| v2)
                .and(Some(current_time_i64)),
            xSetSystemCall: r.xSetSystemCall.filter(|_| v3).and(Some(set_system_call)),
            xGetSystemCall: r.xGetSystemCall.filter(|_| v3).and(Some(get_system_call)),
            xNextSystemCall: r.xNextSystemCall.filter(|_| v3).and(Some(next_system_call)),
        }
    }

    /// The shim's io methods over `real`'s (see [`METHODS`]).
    fn shim_methods(real: *const sqlite3_io_methods) -> *const sqlite3_io_methods {
        let mut tables = sync::lock(&METHODS);
        if let Some((_, ours)) = tables.iter().find(|(r, _)| *r == real as usize) {
            return *ours;
        }
        // SAFETY: `real` is the io methods table of a file the wrapped VFS
        // just opened: valid for the life of the process (VFS method tables
        // are static).
        let r = unsafe { &*real };
        let version = r.iVersion.min(3);
        let v2 = version >= 2;
        let v3 = version >= 3;
        let ours: &'static sqlite3_io_methods = Box::leak(Box::new(sqlite3_io_methods {
            iVersion: version,
            xClose: Some(close),
            xRead: r.xRead.and(Some(read)),
            xWrite: r.xWrite.and(Some(write)),
            xTruncate: r.xTruncate.and(Some(truncate)),
            xSync: r.xSync.and(Some(sync)),
            xFileSize: r.xFileSize.and(Some(file_size)),
            xLock: r.xLock.and(Some(lock_file)),
            xUnlock: r.xUnlock.and(Some(unlock_file)),
            xCheckReservedLock: r.xCheckReservedLock.and(Some(check_reserved_lock)),
            xFileControl: r.xFileControl.and(Some(file_control)),
            xSectorSize: r.xSectorSize.and(Some(sector_size)),
            xDeviceCharacteristics: r.xDeviceCharacteristics.and(Some(device_characteristics)),
            xShmMap: r.xShmMap.filter(|_| v2).and(Some(shm_map)),
            xShmLock: r.xShmLock.filter(|_| v2).and(Some(shm_lock)),
            xShmBarrier: r.xShmBarrier.filter(|_| v2).and(Some(shm_barrier)),
            xShmUnmap: r.xShmUnmap.filter(|_| v2).and(Some(shm_unmap)),
            xFetch: r.xFetch.filter(|_| v3).and(Some(fetch)),
            xUnfetch: r.xUnfetch.filter(|_| v3).and(Some(unfetch)),
        }));
        tables.push((real as usize, ours));
        ours
    }

    /// Whether `methods` is one of the shim's tables (the handle is a
    /// [`ShimFile`]).
    fn is_shim(methods: *const sqlite3_io_methods) -> bool {
        sync::lock(&METHODS)
            .iter()
            .any(|(_, ours)| ptr::eq(*ours, methods))
    }

    /// The database file at `name`, as stat'ed now.
    ///
    /// # Safety
    /// `name` is null or a NUL-terminated string.
    unsafe fn db_file(name: *const c_char) -> Option<DbFile> {
        if name.is_null() {
            return None;
        }
        // SAFETY: the caller's promise.
        let name = OsStr::from_bytes(unsafe { CStr::from_ptr(name) }.to_bytes());
        let meta = std::fs::metadata(name).ok()?;
        Some(DbFile {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Notes that `file` took the write lock of its database on this thread.
    fn note_taken(file: *mut sqlite3_file, db: DbFile) {
        let thread = this_thread();
        let mut holders = sync::lock(&HOLDERS);
        holders.retain(|h| h.file != file as usize);
        holders.push(Holder {
            file: file as usize,
            db,
            thread,
        });
    }

    /// Notes that `file` holds no write lock (any more), whichever thread
    /// lets it go.
    fn note_released(file: *mut sqlite3_file) {
        let mut holders = sync::lock(&HOLDERS);
        holders.retain(|h| h.file != file as usize);
    }

    /// Runs a bookkeeping step; a panic in it must not cross into SQLite.
    fn guarded(step: impl FnOnce()) {
        let _ = catch_unwind(AssertUnwindSafe(step));
    }

    /// The write connection of a queue, as the shim knows its file handle.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct WriterFile {
        file: usize,
        db: DbFile,
    }

    impl WriterFile {
        /// The main database handle of `conn`, if it was opened through the
        /// shim and its file could be stat'ed.
        pub(crate) fn of(conn: &rusqlite::Connection) -> Option<WriterFile> {
            let mut file: *mut sqlite3_file = ptr::null_mut();
            // SAFETY: `conn` is an open connection used by this thread alone
            // for the call; SQLITE_FCNTL_FILE_POINTER writes the main
            // database's handle (a pointer) into `file`, and is answered by
            // SQLite itself, not by the VFS.
            let rc = unsafe {
                rusqlite::ffi::sqlite3_file_control(
                    conn.handle(),
                    c"main".as_ptr(),
                    SQLITE_FCNTL_FILE_POINTER,
                    (&mut file as *mut *mut sqlite3_file).cast(),
                )
            };
            if rc != SQLITE_OK || file.is_null() {
                return None;
            }
            // SAFETY: `file` is the open main database handle of `conn`;
            // when its methods are the shim's it is a ShimFile, whose `db`
            // was written at open and never changes.
            unsafe {
                if !is_shim((*file).pMethods) {
                    return None;
                }
                let db = (*file.cast::<ShimFile>()).db?;
                Some(WriterFile {
                    file: file as usize,
                    db,
                })
            }
        }

        /// Whether this thread holds the write lock of this database file
        /// through a connection other than this writer (an application's
        /// transaction): waiting for the lock would wait for itself.
        pub(crate) fn locked_elsewhere_by_this_thread(&self) -> bool {
            let thread = this_thread();
            thread != 0
                && sync::lock(&HOLDERS)
                    .iter()
                    .any(|h| h.thread == thread && h.db == self.db && h.file != self.file)
        }
    }

    /// The wrapped VFS of the shim `vfs`.
    ///
    /// # Safety
    /// `vfs` is the shim's VFS (SQLite passes it to every VFS method).
    unsafe fn real_vfs(vfs: *mut sqlite3_vfs) -> *mut sqlite3_vfs {
        // SAFETY: the caller's promise; `pAppData` was set by `shim_vfs`.
        unsafe { (*vfs).pAppData.cast() }
    }

    /// The wrapped handle of the shim handle `file`.
    ///
    /// # Safety
    /// `file` is a ShimFile opened by [`open`] (SQLite calls the shim's io
    /// methods only with handles whose methods are the shim's).
    unsafe fn real_file(file: *mut sqlite3_file) -> *mut sqlite3_file {
        // SAFETY: the caller's promise.
        unsafe { (*file.cast::<ShimFile>()).real }
    }

    unsafe extern "C" fn open(
        vfs: *mut sqlite3_vfs,
        name: *const c_char,
        file: *mut sqlite3_file,
        flags: c_int,
        out_flags: *mut c_int,
    ) -> c_int {
        // SAFETY: SQLite hands a buffer of `szOsFile` bytes, 8-aligned: the
        // header, then the wrapped VFS's `szOsFile` bytes for its handle.
        // `name` is null or a path valid for the call. The header is
        // written before anything reads it; `base.pMethods` is set only if
        // the wrapped open left a handle to close, as SQLite then calls
        // xClose (it calls none when pMethods is null).
        unsafe {
            let real_vfs = real_vfs(vfs);
            let real = file.cast::<u8>().add(HEADER).cast::<sqlite3_file>();
            ptr::write(
                file.cast::<ShimFile>(),
                ShimFile {
                    base: sqlite3_file {
                        pMethods: ptr::null(),
                    },
                    real,
                    db: None,
                },
            );
            (*real).pMethods = ptr::null();
            let Some(real_open) = (*real_vfs).xOpen else {
                return SQLITE_ERROR;
            };
            let rc = real_open(real_vfs, name, real, flags, out_flags);
            let methods = (*real).pMethods;
            if methods.is_null() {
                return rc;
            }
            if rc == SQLITE_OK && flags & SQLITE_OPEN_MAIN_DB != 0 {
                let mut db = None;
                guarded(|| db = db_file(name));
                (*file.cast::<ShimFile>()).db = db;
            }
            let mut ours = ptr::null();
            guarded(|| ours = shim_methods(methods));
            if ours.is_null() {
                // The table could not be built: close what was opened.
                if let Some(close) = (*methods).xClose {
                    close(real);
                }
                return SQLITE_ERROR;
            }
            (*file).pMethods = ours;
            rc
        }
    }

    /// Forwards a VFS method to the wrapped VFS.
    macro_rules! vfs_forward {
        ($vfs:ident . $method:ident ( $($arg:expr),* ) or $missing:expr) => {{
            // SAFETY: SQLite calls this method with the shim's VFS and
            // arguments valid for the wrapped VFS's method of the same name,
            // which exists (the shim offers only the methods it has).
            unsafe {
                let real = real_vfs($vfs);
                match (*real).$method {
                    Some(f) => f(real, $($arg),*),
                    None => $missing,
                }
            }
        }};
    }

    /// Forwards an io method to the wrapped handle.
    macro_rules! file_forward {
        ($file:ident . $method:ident ( $($arg:expr),* ) or $missing:expr) => {{
            // SAFETY: SQLite calls the shim's io methods with a handle the
            // shim opened and arguments valid for the wrapped handle's method
            // of the same name, which exists (the shim's table offers only
            // the methods the wrapped table has).
            unsafe {
                let real = real_file($file);
                match (*(*real).pMethods).$method {
                    Some(f) => f(real, $($arg),*),
                    None => $missing,
                }
            }
        }};
    }

    unsafe extern "C" fn delete(
        vfs: *mut sqlite3_vfs,
        name: *const c_char,
        sync_dir: c_int,
    ) -> c_int {
        vfs_forward!(vfs.xDelete(name, sync_dir) or SQLITE_ERROR)
    }

    unsafe extern "C" fn access(
        vfs: *mut sqlite3_vfs,
        name: *const c_char,
        flags: c_int,
        out: *mut c_int,
    ) -> c_int {
        vfs_forward!(vfs.xAccess(name, flags, out) or SQLITE_ERROR)
    }

    unsafe extern "C" fn full_pathname(
        vfs: *mut sqlite3_vfs,
        name: *const c_char,
        n_out: c_int,
        out: *mut c_char,
    ) -> c_int {
        vfs_forward!(vfs.xFullPathname(name, n_out, out) or SQLITE_ERROR)
    }

    unsafe extern "C" fn dl_open(vfs: *mut sqlite3_vfs, name: *const c_char) -> *mut c_void {
        vfs_forward!(vfs.xDlOpen(name) or ptr::null_mut())
    }

    unsafe extern "C" fn dl_error(vfs: *mut sqlite3_vfs, n: c_int, out: *mut c_char) {
        vfs_forward!(vfs.xDlError(n, out) or ())
    }

    type DlSym = unsafe extern "C" fn(*mut sqlite3_vfs, *mut c_void, *const c_char);

    unsafe extern "C" fn dl_sym(
        vfs: *mut sqlite3_vfs,
        handle: *mut c_void,
        symbol: *const c_char,
    ) -> Option<DlSym> {
        vfs_forward!(vfs.xDlSym(handle, symbol) or None)
    }

    unsafe extern "C" fn dl_close(vfs: *mut sqlite3_vfs, handle: *mut c_void) {
        vfs_forward!(vfs.xDlClose(handle) or ())
    }

    unsafe extern "C" fn randomness(vfs: *mut sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
        vfs_forward!(vfs.xRandomness(n, out) or 0)
    }

    unsafe extern "C" fn sleep(vfs: *mut sqlite3_vfs, micros: c_int) -> c_int {
        vfs_forward!(vfs.xSleep(micros) or 0)
    }

    unsafe extern "C" fn current_time(vfs: *mut sqlite3_vfs, out: *mut f64) -> c_int {
        vfs_forward!(vfs.xCurrentTime(out) or SQLITE_ERROR)
    }

    unsafe extern "C" fn get_last_error(
        vfs: *mut sqlite3_vfs,
        n: c_int,
        out: *mut c_char,
    ) -> c_int {
        vfs_forward!(vfs.xGetLastError(n, out) or 0)
    }

    unsafe extern "C" fn current_time_i64(vfs: *mut sqlite3_vfs, out: *mut sqlite3_int64) -> c_int {
        vfs_forward!(vfs.xCurrentTimeInt64(out) or SQLITE_ERROR)
    }

    unsafe extern "C" fn set_system_call(
        vfs: *mut sqlite3_vfs,
        name: *const c_char,
        call: sqlite3_syscall_ptr,
    ) -> c_int {
        vfs_forward!(vfs.xSetSystemCall(name, call) or SQLITE_ERROR)
    }

    unsafe extern "C" fn get_system_call(
        vfs: *mut sqlite3_vfs,
        name: *const c_char,
    ) -> sqlite3_syscall_ptr {
        vfs_forward!(vfs.xGetSystemCall(name) or None)
    }

    unsafe extern "C" fn next_system_call(
        vfs: *mut sqlite3_vfs,
        name: *const c_char,
    ) -> *const c_char {
        vfs_forward!(vfs.xNextSystemCall(name) or ptr::null())
    }

    unsafe extern "C" fn close(file: *mut sqlite3_file) -> c_int {
        let rc = file_forward!(file.xClose() or SQLITE_ERROR);
        // Closing drops every lock the handle held (a connection closed
        // inside its transaction has rolled it back by now, but be sure).
        guarded(|| note_released(file));
        rc
    }

    unsafe extern "C" fn read(
        file: *mut sqlite3_file,
        buf: *mut c_void,
        amount: c_int,
        offset: sqlite3_int64,
    ) -> c_int {
        file_forward!(file.xRead(buf, amount, offset) or SQLITE_ERROR)
    }

    unsafe extern "C" fn write(
        file: *mut sqlite3_file,
        buf: *const c_void,
        amount: c_int,
        offset: sqlite3_int64,
    ) -> c_int {
        file_forward!(file.xWrite(buf, amount, offset) or SQLITE_ERROR)
    }

    unsafe extern "C" fn truncate(file: *mut sqlite3_file, size: sqlite3_int64) -> c_int {
        file_forward!(file.xTruncate(size) or SQLITE_ERROR)
    }

    unsafe extern "C" fn sync(file: *mut sqlite3_file, flags: c_int) -> c_int {
        file_forward!(file.xSync(flags) or SQLITE_ERROR)
    }

    unsafe extern "C" fn file_size(file: *mut sqlite3_file, size: *mut sqlite3_int64) -> c_int {
        file_forward!(file.xFileSize(size) or SQLITE_ERROR)
    }

    unsafe extern "C" fn lock_file(file: *mut sqlite3_file, level: c_int) -> c_int {
        file_forward!(file.xLock(level) or SQLITE_ERROR)
    }

    unsafe extern "C" fn unlock_file(file: *mut sqlite3_file, level: c_int) -> c_int {
        file_forward!(file.xUnlock(level) or SQLITE_ERROR)
    }

    unsafe extern "C" fn check_reserved_lock(file: *mut sqlite3_file, out: *mut c_int) -> c_int {
        file_forward!(file.xCheckReservedLock(out) or SQLITE_ERROR)
    }

    unsafe extern "C" fn file_control(
        file: *mut sqlite3_file,
        op: c_int,
        arg: *mut c_void,
    ) -> c_int {
        file_forward!(file.xFileControl(op, arg) or SQLITE_ERROR)
    }

    unsafe extern "C" fn sector_size(file: *mut sqlite3_file) -> c_int {
        file_forward!(file.xSectorSize() or 0)
    }

    unsafe extern "C" fn device_characteristics(file: *mut sqlite3_file) -> c_int {
        file_forward!(file.xDeviceCharacteristics() or 0)
    }

    unsafe extern "C" fn shm_map(
        file: *mut sqlite3_file,
        region: c_int,
        size: c_int,
        extend: c_int,
        out: *mut *mut c_void,
    ) -> c_int {
        file_forward!(file.xShmMap(region, size, extend, out) or SQLITE_ERROR)
    }

    unsafe extern "C" fn shm_lock(
        file: *mut sqlite3_file,
        offset: c_int,
        n: c_int,
        flags: c_int,
    ) -> c_int {
        let rc = file_forward!(file.xShmLock(offset, n, flags) or SQLITE_ERROR);
        // Slot 0 is WAL_WRITE_LOCK (wal.c); a range from 0 covers it.
        if offset == 0 && n >= 1 && flags & SQLITE_SHM_EXCLUSIVE != 0 {
            if flags & SQLITE_SHM_LOCK != 0 && rc == SQLITE_OK {
                // SAFETY: `file` is a ShimFile (see `real_file`); `db` was
                // written at open and never changes.
                if let Some(db) = unsafe { (*file.cast::<ShimFile>()).db } {
                    guarded(|| note_taken(file, db));
                }
            } else if flags & SQLITE_SHM_UNLOCK != 0 {
                guarded(|| note_released(file));
            }
        }
        rc
    }

    unsafe extern "C" fn shm_barrier(file: *mut sqlite3_file) {
        file_forward!(file.xShmBarrier() or ())
    }

    unsafe extern "C" fn shm_unmap(file: *mut sqlite3_file, delete: c_int) -> c_int {
        let rc = file_forward!(file.xShmUnmap(delete) or SQLITE_ERROR);
        // Unmapping drops this handle's shared-memory locks.
        guarded(|| note_released(file));
        rc
    }

    unsafe extern "C" fn fetch(
        file: *mut sqlite3_file,
        offset: sqlite3_int64,
        amount: c_int,
        out: *mut *mut c_void,
    ) -> c_int {
        file_forward!(file.xFetch(offset, amount, out) or SQLITE_ERROR)
    }

    unsafe extern "C" fn unfetch(
        file: *mut sqlite3_file,
        offset: sqlite3_int64,
        page: *mut c_void,
    ) -> c_int {
        file_forward!(file.xUnfetch(offset, page) or SQLITE_ERROR)
    }
}
