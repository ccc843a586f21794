INSERT INTO app.q_daemons (name, instance) SELECT wanted.unnest_1, wanted.unnest_2 
FROM (SELECT unnest(%(names)s::TEXT[]) AS unnest_1, unnest(%(instances)s::INTEGER[]) AS unnest_2) AS wanted ON CONFLICT (name, instance) DO NOTHING
