-- Stored `lstar stress` documents (schema lstar-stress/1) and the curves each qualifies. The
-- flags are not stored: they are computed from the documents by the limits in force
-- (monitor.stress.limits), so a documented limit that changes re-flags every stored result.
CREATE TABLE stress_reports (
    report_id     VARCHAR PRIMARY KEY,     -- sha256 of the document's canonical JSON
    subject_kind  VARCHAR NOT NULL,
    subject_name  VARCHAR NOT NULL,
    tests         JSON NOT NULL,           -- the section names the document holds
    document      JSON NOT NULL,
    stored_at     TIMESTAMPTZ NOT NULL
);
CREATE TABLE stress_report_curves (
    report_id     VARCHAR NOT NULL,
    curve_id      VARCHAR NOT NULL,
    PRIMARY KEY (report_id, curve_id)
);
