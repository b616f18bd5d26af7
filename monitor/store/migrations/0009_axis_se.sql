-- Every score axis with its standard error (docs/measurement.md §2a): L* per byte (bits/byte
-- minus the unigram model's bits/byte) and the SEs of bits/byte, L* per byte, L_rel and L_gain,
-- all from the run's one seeded document bootstrap. Runs scored before this have no bootstrap
-- SE of bits/byte or L* per byte (NULL: a curve on those axes records why it cannot use them);
-- L* per byte, and the SEs of L_rel and L_gain (SE(CE) / CE_uni, CE_uni being a constant), follow
-- exactly from stored columns and are filled in.
ALTER TABLE score_runs ADD COLUMN lstar_per_byte DOUBLE;
ALTER TABLE score_runs ADD COLUMN se_bits_per_byte DOUBLE;
ALTER TABLE score_runs ADD COLUMN se_lstar_per_byte DOUBLE;
ALTER TABLE score_runs ADD COLUMN se_l_rel DOUBLE;
ALTER TABLE score_runs ADD COLUMN se_l_gain DOUBLE;
UPDATE score_runs SET lstar_per_byte = lstar * tokens_per_byte / ln(2);
UPDATE score_runs SET se_l_rel = se_ce / ce_unigram, se_l_gain = se_ce / ce_unigram WHERE ce_unigram > 0;
