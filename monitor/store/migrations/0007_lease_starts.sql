-- When each lease was taken: the start of the attempt it covers. A lease whose process died
-- is recorded as an attempt that started then (not when the lease would have expired).
ALTER TABLE checkpoints ADD COLUMN lease_started_at TIMESTAMPTZ;
ALTER TABLE notifications ADD COLUMN lease_started_at TIMESTAMPTZ;
