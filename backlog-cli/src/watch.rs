//! `backlog watch`: the stats table, refreshed in place like `top`.
//!
//! On a terminal: the alternate screen in raw mode, redrawn every interval;
//! q, Esc or Ctrl-C quits and gives the terminal back as it was. Elsewhere
//! (a pipe, `--count`): one table (or JSON line) per refresh.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant, SystemTime};

use backlog::Queue;
use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use crossterm::{cursor, execute, terminal};

use crate::fail::{Code, Failure};
use crate::output;

/// The longest `--interval`: a longer one would be no refresh at all (and
/// a deadline past what the clock can hold).
const MAX_INTERVAL: Duration = Duration::from_secs(86_400);

pub fn run(
    queue: &Queue,
    interval: Duration,
    count: Option<u64>,
    json: bool,
) -> Result<(), Failure> {
    if interval < Duration::from_millis(100) || interval > MAX_INTERVAL {
        return Err(Failure::new(
            Code::InvalidInput,
            "--interval must be from 100ms to 1day",
        ));
    }
    let interactive = count.is_none()
        && !json
        && std::io::stdout().is_terminal()
        && std::io::stdin().is_terminal();
    if interactive {
        return on_screen(queue, interval);
    }
    let mut stdout = std::io::stdout().lock();
    let mut shown = 0;
    loop {
        let stats = queue.stats()?;
        if json {
            let line = serde_json::json!({
                "at": humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
                "queues": output::stats_json(&stats),
            });
            writeln!(stdout, "{line}")?;
        } else {
            write!(
                stdout,
                "{}\n{}\n",
                header(queue),
                output::stats_table(&stats)
            )?;
        }
        stdout.flush()?;
        shown += 1;
        if count.is_some_and(|c| shown >= c) {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

fn header(queue: &Queue) -> String {
    let db = queue
        .path()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "server".into());
    format!(
        "backlog watch: {} at {}",
        output::safe(&db),
        humantime::format_rfc3339_seconds(SystemTime::now())
    )
}

/// Gives the terminal back however `on_screen` ends.
struct Screen;

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

fn on_screen(queue: &Queue, interval: Duration) -> Result<(), Failure> {
    let io = |e: std::io::Error| Failure::new(Code::Other, format!("terminal: {e}"));
    terminal::enable_raw_mode().map_err(io)?;
    let _screen = Screen;
    let mut stdout = std::io::stdout();
    execute!(stdout, terminal::EnterAlternateScreen, cursor::Hide).map_err(io)?;
    loop {
        let started = Instant::now();
        let body = match queue.stats() {
            Ok(stats) => output::stats_table(&stats),
            Err(e) => format!("cannot read the queue: {}\n", output::safe(&e.to_string())),
        };
        let text = format!(
            "{}  (every {}; q quits)\n\n{body}",
            header(queue),
            humantime::format_duration(interval)
        );
        execute!(
            stdout,
            cursor::MoveTo(0, 0),
            terminal::Clear(terminal::ClearType::All)
        )
        .map_err(io)?;
        // Raw mode: a newline does not return the carriage.
        stdout
            .write_all(text.replace('\n', "\r\n").as_bytes())
            .map_err(io)?;
        stdout.flush().map_err(io)?;
        while let Some(left) = interval.checked_sub(started.elapsed()) {
            if !event::poll(left).map_err(io)? {
                break;
            }
            if let Event::Key(key) = event::read().map_err(io)? {
                let ctrl_c =
                    key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c');
                let quit = matches!(key.code, KeyCode::Char('q' | 'Q') | KeyCode::Esc);
                if key.kind == KeyEventKind::Press && (quit || ctrl_c) {
                    return Ok(());
                }
            }
        }
    }
}
