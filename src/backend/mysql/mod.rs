//! The MySQL/MariaDB backend (being written).
