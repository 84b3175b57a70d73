"""Result records (one JSON-lines schema) and their renderings: tables, CSV, plots. No torch here."""
