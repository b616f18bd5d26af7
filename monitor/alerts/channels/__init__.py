"""The channels an alert or a report goes out through: webhook, email, file."""
