SELECT highest::text, exclusive::text FROM distlock_fence WHERE resource = $1
