"""The Prosocial Ranking Challenge's ranker interface (docs/prc.md): `POST /rank` with a session and a
list of content items, answered with their ranked ids. `schema` mirrors the published models,
`adapter` turns ctrlsim's user states into PRC requests (and chooses each request's candidate pool),
`box` is a PRC ranker as a ctrlsim black box (`make_recommender("prc+http://host:port/rank", ds)`), and
`serve` serves any ctrlsim box as a PRC ranker (`ctrlsim serve --contract prc BOX`)."""
