"""Small fixture datasets written in the real on-disk formats.

Each fixture writes a handful of realistic rows into `tmp_path` exactly as the
public distributions lay them out (separators, headers, encodings, quoting),
and returns the folder or file paths. Tests that check error paths overwrite
one of the files with a broken variant.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

# ----------------------------------------------------------- MovieLens-1M .dat
# '::'-separated, no header, latin-1 encoded (note the accented title of movie 73
# and the single ':' inside the Star Wars title).
ML1M_MOVIES = (
    "1::Toy Story (1995)::Animation|Children's|Comedy\n"
    "2::Jumanji (1995)::Adventure|Children's|Fantasy\n"
    "73::Misérables, Les (1995)::Drama|Musical\n"
    "260::Star Wars: Episode IV - A New Hope (1977)::Action|Adventure|Fantasy|Sci-Fi\n"
    "1193::One Flew Over the Cuckoo's Nest (1975)::Drama\n"
    "2355::Bug's Life, A (1998)::Animation|Children's|Comedy\n"
    "3408::Erin Brockovich (2000)::Drama\n"
)
ML1M_RATINGS = (
    "1::1193::5::978300760\n"
    "1::3408::4::978300275\n"
    "1::2355::5::978824291\n"
    "1::1::5::978824268\n"
    "2::1193::5::978298413\n"
    "2::3408::3::978299000\n"
    "2::260::4::978299200\n"
    "3::260::5::978297018\n"
    "3::73::2::978297039\n"
    "4::1::4::978294008\n"
)
# UserID::Gender::Age::Occupation::Zip-code (age is the bracket's lower bound).
ML1M_USERS = (
    "1::F::1::10::48067\n"
    "2::M::56::16::70072\n"
    "3::M::25::15::55117\n"
    "4::M::45::7::02460\n"
)


def write_latin1(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("latin-1"))
    return path


@pytest.fixture
def ml1m_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "ml-1m"
    folder.mkdir()
    write_latin1(folder / "movies.dat", ML1M_MOVIES)
    write_latin1(folder / "ratings.dat", ML1M_RATINGS)
    write_latin1(folder / "users.dat", ML1M_USERS)
    return folder


# ------------------------------------------------- MovieLens-25M / latest .csv
# UTF-8, header row, titles with commas are quoted, embedded quotes doubled.
ML25M_MOVIES = (
    "movieId,title,genres\n"
    "1,Toy Story (1995),Adventure|Animation|Children|Comedy|Fantasy\n"
    '11,"American President, The (1995)",Comedy|Drama|Romance\n'
    '2338,"""Great Performances"" Cats (1998)",Musical\n'
    '4973,"Amélie (Fabuleux destin d\'Amélie Poulain, Le) (2001)",Comedy|Romance\n'
    "40697,Babylon 5,Sci-Fi\n"
    "114335,La cravate (1957),(no genres listed)\n"
)
ML25M_RATINGS = (
    "userId,movieId,rating,timestamp\n"
    "1,1,4.0,964982703\n"
    "1,11,3.5,964981247\n"
    "1,4973,5.0,964982224\n"
    "2,1,2.5,1445714835\n"
    "2,114335,3.0,1445715000\n"
    "3,40697,0.5,1306463578\n"
    "3,4973,4.5,1306464000\n"
)
# links.csv: some movies have no TMDb id (empty field), as in the real file.
ML25M_LINKS = (
    "movieId,imdbId,tmdbId\n"
    "1,0114709,862\n"
    "11,0112346,9087\n"
    "2338,0173714,\n"
    "4973,0211915,194\n"
    "40697,0105946,\n"
    "114335,0050215,101765\n"
)


@pytest.fixture
def ml25m_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "ml-25m"
    folder.mkdir()
    (folder / "movies.csv").write_text(ML25M_MOVIES, encoding="utf-8")
    (folder / "ratings.csv").write_text(ML25M_RATINGS, encoding="utf-8")
    (folder / "links.csv").write_text(ML25M_LINKS, encoding="utf-8")
    return folder


# ------------------------------------------------------------ Last.fm-1K .tsv
# userid \t timestamp \t musicbrainz-artist-id \t artist-name \t musicbrainz-track-id \t track-name
# No header; newest first per user; many rows lack a track mbid.
LASTFM_EVENTS = (
    "user_000001\t2009-05-04T23:08:57Z\tf1b1cf71-bd35-4e99-8624-24a6e15f133a\tDeep Dish\t\t"
    "Fuck Me Im Famous (Pacha Ibiza)-09-28-2007\n"
    "user_000001\t2009-05-04T13:54:10Z\ta7f7df4a-77d8-4f12-8acd-5c60c93f4de8\t坂本龍一\t\t"
    "Composition 0919 (Live_2009_4_15)\n"
    "user_000001\t2009-05-04T13:52:04Z\ta7f7df4a-77d8-4f12-8acd-5c60c93f4de8\t坂本龍一\t\t"
    "Mc2 (Live_2009_4_15)\n"
    "user_000001\t2009-05-04T13:42:52Z\ta7f7df4a-77d8-4f12-8acd-5c60c93f4de8\t坂本龍一\t\t"
    "Composition 0919 (Live_2009_4_15)\n"
    "user_000002\t2009-06-20T00:47:03Z\tb10bbbfc-cf9e-42e0-be17-e2c3e1d2600d\tThe Beatles\t"
    "5dd95ad7-9e6c-4a8f-a6d5-8e7e2d2a6b7f\tHelp!\n"
    "user_000002\t2009-06-19T23:12:44Z\tb10bbbfc-cf9e-42e0-be17-e2c3e1d2600d\tThe Beatles\t"
    "5dd95ad7-9e6c-4a8f-a6d5-8e7e2d2a6b7f\tHelp!\n"
    "user_000002\t2009-06-19T22:59:01Z\tb10bbbfc-cf9e-42e0-be17-e2c3e1d2600d\tThe Beatles\t"
    "5dd95ad7-9e6c-4a8f-a6d5-8e7e2d2a6b7f\tHelp!\n"
    "user_000002\t2009-06-19T22:55:30Z\ta74b1b7f-71a5-4011-9441-d0b5e4122711\tRadiohead\t"
    "6b9a509f-6907-4a6e-9345-2f12da09ba4b\tKarma Police\n"
    "user_000003\t2008-12-31T23:59:59Z\ta74b1b7f-71a5-4011-9441-d0b5e4122711\tRadiohead\t"
    "6b9a509f-6907-4a6e-9345-2f12da09ba4b\tKarma Police\n"
)
LASTFM_PROFILES = (
    "#id\tgender\tage\tcountry\tregistered\n"
    "user_000001\tm\t\tJapan\tAug 13, 2006\n"
    "user_000002\tf\t\tPeru\tFeb 24, 2006\n"
    "user_000003\tm\t22\tUnited States\tOct 30, 2005\n"
    "user_000004\tf\t\t\tApr 26, 2006\n"
    "user_000005\t\t\tBulgaria\tJun 29, 2006\n"
)
LASTFM_EVENTS_NAME = "userid-timestamp-artid-artname-traid-traname.tsv"


@pytest.fixture
def lastfm_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "lastfm-dataset-1K"
    folder.mkdir()
    (folder / LASTFM_EVENTS_NAME).write_text(LASTFM_EVENTS, encoding="utf-8")
    (folder / "userid-profile.tsv").write_text(LASTFM_PROFILES, encoding="utf-8")
    return folder


# ------------------------------------------------------------ RecBole atomic
ATOMIC_INTER = (
    "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    "1\t101\t4\t881250949\n"
    "1\t102\t3\t881250950\n"
    "2\t101\t5\t881250000\n"
    "2\t103\t1\t881260000\n"
    "3\t104\t2\t881250500\n"
)
ATOMIC_ITEM = (
    "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
    "101\tToy Story\t1995\tAnimation Children's Comedy\n"
    "102\tGoldenEye\t1995\tAction Adventure Thriller\n"
    "103\tFour Rooms\t1995\tThriller\n"
    "104\tUnknown Film\t\tunknown\n"
    "105\tNever Rated\t1997\tDrama Film-Noir\n"
)
ATOMIC_USER = (
    "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
    "1\t24\tM\ttechnician\t85711\n"
    "2\t53\tF\tother\t94043\n"
    "3\t35\tM\twriter\t32067\n"
)


@pytest.fixture
def atomic_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "mini"
    folder.mkdir()
    (folder / "mini.inter").write_text(ATOMIC_INTER)
    (folder / "mini.item").write_text(ATOMIC_ITEM)
    (folder / "mini.user").write_text(ATOMIC_USER)
    return folder


# ------------------------------------------------------- Amazon review jsonl
# 2014/2018 field names (reviewerID, asin, overall, unixReviewTime; metadata
# with nested `categories` paths).
AMAZON_2014_REVIEWS = [
    {"reviewerID": "A2IBPI20UZIR0U", "asin": "1384719342", "reviewerName": "cassandra tu",
     "helpful": [0, 0], "reviewText":
         "Not much to write about here, but it does exactly what it's supposed to.",
     "overall": 5.0, "summary": "good", "unixReviewTime": 1393545600, "reviewTime": "02 28, 2014"},
    {"reviewerID": "A14VAT5EAX3D9S", "asin": "1384719342", "reviewerName": "Jake",
     "helpful": [13, 14], "reviewText": "The product does exactly as it should and is quite affordable.",
     "overall": 5.0, "summary": "Jake", "unixReviewTime": 1363392000, "reviewTime": "03 16, 2013"},
    {"reviewerID": "A2IBPI20UZIR0U", "asin": "B00004Y2UT", "reviewerName": "cassandra tu",
     "helpful": [0, 0], "reviewText": "Works well.", "overall": 3.0, "summary": "ok",
     "unixReviewTime": 1356048000, "reviewTime": "12 21, 2012"},
    {"reviewerID": "A195EZSQDW3E21", "asin": "B0000XXXXX", "reviewerName": "Rick Bennette",
     "helpful": [1, 1], "reviewText": "No metadata for this one.", "overall": 4.0, "summary": "fine",
     "unixReviewTime": 1380931200, "reviewTime": "10 5, 2013"},
]
AMAZON_2014_META = [
    {"asin": "1384719342", "title": "Monster Cable Guitar Pop Filter",
     "categories": [["Musical Instruments", "Instrument Accessories", "Guitar & Bass Accessories"],
                    ["Musical Instruments", "Microphones"]],
     "description": "A pop filter that blocks breath noise."},
    {"asin": "B00004Y2UT", "title": "Hosa XLR Cable",
     "categories": [["Musical Instruments", "Instrument Accessories", "Cables"]],
     "description": "Balanced XLR cable, 10 ft."},
    {"asin": "B00006I5SD", "categories": [["Musical Instruments"]]},
]

# 2023 field names (user_id, parent_asin, rating, timestamp in milliseconds).
AMAZON_2023_REVIEWS = [
    {"rating": 5.0, "title": "Such a lovely scent but not overpowering.",
     "text": "This spray is really nice. It smells really good.", "images": [],
     "asin": "B00YQ6X8EO", "parent_asin": "B00YQ6X8EO", "user_id": "AGKHLEW2SOWHNMFQIJGBECAF7INQ",
     "timestamp": 1588687728923, "helpful_vote": 0, "verified_purchase": True},
    {"rating": 4.0, "title": "Works great but smells a little weird.",
     "text": "This product does what I need it to do.", "images": [],
     "asin": "B081TJ8YS3", "parent_asin": "B081TJ8YS3", "user_id": "AGKHLEW2SOWHNMFQIJGBECAF7INQ",
     "timestamp": 1588615855070, "helpful_vote": 1, "verified_purchase": True},
    {"rating": 1.0, "title": "Not as described", "text": "Arrived broken.", "images": [],
     "asin": "B07PNNCSP9", "parent_asin": "B097R46CSY", "user_id": "AE74DYR3QUGVPZJ3P7RFWBGIX7XQ",
     "timestamp": 1589665266052, "helpful_vote": 0, "verified_purchase": False},
]
AMAZON_2023_META = [
    {"main_category": "All Beauty", "title": "Herbivore - Natural Sea Mist Texturizing Salt Spray",
     "average_rating": 4.3, "rating_number": 1045, "features": [],
     "description": ["Sea salt spray", "for beach waves."], "price": None, "images": [], "videos": [],
     "store": "Herbivore", "categories": ["Beauty & Personal Care", "Hair Care"],
     "details": {"Item Form": "Spray"}, "parent_asin": "B00YQ6X8EO", "bought_together": None},
    {"main_category": "All Beauty", "title": "All Natural Vegan Dry Shampoo Powder",
     "average_rating": 4.0, "rating_number": 7, "features": [], "description": [], "price": 12.99,
     "images": [], "videos": [], "store": "Ciao Bella", "categories": [],
     "details": {}, "parent_asin": "B081TJ8YS3", "bought_together": None},
    {"main_category": "All Beauty", "title": "Bamboo Bath Brush",
     "average_rating": 3.5, "rating_number": 2, "features": [], "description": ["Long handle."],
     "price": None, "images": [], "videos": [], "store": None,
     "categories": ["Beauty & Personal Care", "Tools & Accessories"],
     "details": {}, "parent_asin": "B097R46CSY", "bought_together": None},
]


def write_jsonl(path: Path, records, *, gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in records)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def amazon_2014(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "amazon2014"
    folder.mkdir()
    return (write_jsonl(folder / "reviews_Musical_Instruments_5.json", AMAZON_2014_REVIEWS),
            write_jsonl(folder / "meta_Musical_Instruments.json", AMAZON_2014_META))


@pytest.fixture
def amazon_2023(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "amazon2023"
    folder.mkdir()
    return (write_jsonl(folder / "All_Beauty.jsonl.gz", AMAZON_2023_REVIEWS, gz=True),
            write_jsonl(folder / "meta_All_Beauty.jsonl.gz", AMAZON_2023_META, gz=True))
