"""Items and a profile whose ratings any instruction-tuned LLM should order: a sci-fi fan rates
sci-fi films above romantic comedies (used by the behaviour tests of every runtime and model)."""


SCIFI = ["Star Wars (1977), (Action, Adventure, Sci-Fi)", "Alien (1979), (Horror, Sci-Fi)",
         "The Matrix (1999), (Action, Sci-Fi)", "Blade Runner (1982), (Film-Noir, Sci-Fi)",
         "Star Trek: First Contact (1996), (Action, Adventure, Sci-Fi)"]
ROMCOM = ["Sleepless in Seattle (1993), (Comedy, Romance)", "Notting Hill (1999), (Comedy, Romance)",
          "Pretty Woman (1990), (Comedy, Romance)", "While You Were Sleeping (1995), (Comedy, Romance)",
          "French Kiss (1995), (Comedy, Romance)"]
PROFILE = ("I love science fiction films: space battles, aliens, robots and the future. "
           "I find romantic comedies boring and never watch them.")


def rating_prompt(item):
    return [{"role": "system", "content": "You are a movie recommender."},
            {"role": "user", "content": f"User profile: {PROFILE}\n\nHow much would this user enjoy "
                                        f"the movie {item}? Rate it from 0 (not at all) to 5 (very much)."}]
