//! The PostgreSQL backend (being written).
