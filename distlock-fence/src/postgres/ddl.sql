CREATE TABLE IF NOT EXISTS distlock_fence (
    -- the fenced resource's name, as distlock_core::fence::check_resource takes it
    resource   text PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 1024),
    -- the highest token admitted, of any holder (every u64, exactly)
    highest    numeric(20, 0) NOT NULL CHECK (highest BETWEEN 1 AND 18446744073709551615),
    -- the highest token of an exclusive holder admitted (0: none yet)
    exclusive  numeric(20, 0) NOT NULL CHECK (exclusive BETWEEN 0 AND highest),
    updated_at timestamptz NOT NULL DEFAULT now()
);
