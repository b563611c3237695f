INSERT INTO distlock_fence AS f (resource, highest, exclusive)
VALUES ($1, $2::text::numeric, CASE WHEN $3::bool THEN $2::text::numeric ELSE 0 END)
ON CONFLICT (resource) DO UPDATE
    SET highest    = GREATEST(f.highest, EXCLUDED.highest),
        exclusive  = CASE WHEN $3::bool THEN EXCLUDED.highest ELSE f.exclusive END,
        updated_at = now()
    -- the rule: an exclusive token reaches the highest, a shared one the highest exclusive
    WHERE EXCLUDED.highest >= CASE WHEN $3::bool THEN f.highest ELSE f.exclusive END
RETURNING highest::text, exclusive::text
