-- What each policy reload that changed a task's judgement did: the settings before and after
-- (curve id, margin, level, confidence, budget, derivatives), how many checkpoints it
-- re-evaluated and how many alerts it resolved or raised, and the one line the daemon logged.
-- Reports list the changes of their window.
CREATE SEQUENCE policy_change_ids START 1;
CREATE TABLE policy_changes (
    id            BIGINT PRIMARY KEY DEFAULT nextval('policy_change_ids'),
    policy        VARCHAR NOT NULL,
    task          VARCHAR NOT NULL,
    before        JSON NOT NULL,
    after         JSON NOT NULL,
    reevaluated   INTEGER NOT NULL,
    resolved      INTEGER NOT NULL,
    fired         INTEGER NOT NULL,
    summary       VARCHAR NOT NULL,
    changed_at    TIMESTAMPTZ NOT NULL
);
